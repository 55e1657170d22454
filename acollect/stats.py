"""Collection statistics: episode returns from batches, frame rates over a window, one snapshot type.

Three pieces, usable wherever batches are made:

* :class:`EpisodeTracker` reads ``("next", "reward")`` and ``("next", "done")``
  of each ``[..., T]`` batch and reports the episodes that ended in it
  (:class:`EpisodeSummary`), also in a worker, whose batch headers carry them
  (both are defined in :mod:`acollect._episodes`, which workers import without
  the rest, and are this module's names).
* :class:`StatsRecorder` lives with a collector, on the event loop: it takes
  each batch's frame count and each worker's report, and keeps frames/s over a
  recent window (overall and per worker) and the last episodes.
* :class:`CollectorStats` is what ``collector.stats()`` returns.

Examples:
    >>> from acollect import Collector
    >>> stats = Collector("CartPole-v1", frames_per_batch=8).stats()
    >>> stats.frames, stats.episodes
    (0, 0)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from acollect._episodes import EPISODE_WINDOW as EPISODE_WINDOW
from acollect._episodes import EpisodeSummary as EpisodeSummary
from acollect._episodes import EpisodeTracker as EpisodeTracker
from acollect._time_split import TRAINER, TimeSplitWindow, collecting_cpu_s, read_schedstat

__all__ = [
    "EPISODE_WINDOW",
    "RATE_WINDOW_S",
    "CollectorStats",
    "EpisodeSummary",
    "EpisodeTracker",
    "RateWindow",
    "StatsRecorder",
]

#: Seconds of recent batches over which frames/s are measured.
RATE_WINDOW_S = 10.0


class RateWindow:
    """Events per second over the samples of the last ``window_s`` seconds.

    Examples:
        >>> w = RateWindow(window_s=10.0)
        >>> w.add(0, now=0.0); w.add(100, now=1.0); w.add(100, now=2.0)
        >>> w.rate()
        100.0
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.total = 0
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, count: int, *, now: float | None = None) -> None:
        """Records ``count`` new events (``0`` marks the start of measuring)."""
        t = time.monotonic() if now is None else now
        self.total += count
        samples = self._samples
        samples.append((t, self.total))
        # Keep one sample older than the window, so the rate always spans at least the last interval.
        while len(samples) > 2 and samples[1][0] < t - self.window_s:
            samples.popleft()

    def restart(self, now: float | None = None) -> None:
        """Measures afresh from ``now`` (the total stays): a pause is no time of collecting.

        Examples:
            >>> w = RateWindow(window_s=10.0)
            >>> w.add(0, now=0.0); w.add(100, now=1.0); w.restart(now=30.0); w.add(50, now=30.5)
            >>> w.rate(), w.total
            (100.0, 150)
        """
        self._samples.clear()
        self.add(0, now=now)

    def rate(self) -> float:
        """Events per second between the oldest and newest sample kept (``0.0`` before two samples)."""
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass(frozen=True)
class CollectorStats:
    """A snapshot of a collector's progress, from ``collector.stats()``.

    Attributes:
        frames: frames handed out so far (continues after ``load_state_dict``).
        batches: batches handed out so far.
        elapsed_s: seconds since collection started.
        frames_per_s: frames per second over the batches of the last 10 seconds.
        episodes: episodes that ended so far.
        episode_return_mean: mean return of the last 100 episodes (``None`` before the first ended).
        episode_return_last: return of the last episode that ended.
        episode_length_mean: mean length (steps) of the last 100 episodes.
        episode_length_last: length of the last episode that ended.
        group_return_mean: for a multi-agent env, the mean return of the last 100 episodes per group of agents,
            summed over the group's agents (``episode_return_mean`` is their sum); empty for one reward.
        policy_version: the collector's current policy version.
        policy_lag: per worker, ``policy_version`` minus the oldest version that chose an action in its last
            batch (the smallest ``("collector", "policy_version")`` of its frames; the in-process collector is
            worker 0). Workers that run the policy themselves apply weights at batch boundaries only, so every
            frame of a batch has one version; with central inference a batch may span several.
        worker_frames_per_s: per worker, frames per second over the last 10 seconds.
        restarts: worker processes restarted after a crash or hang.
        dropped_batches: batches lost to worker restarts (lockstep: every part a dead worker was asked for,
            which its successor collects again; up to two when it was running ahead).
        discarded_frames: frames stepped and given up on purpose, never handed out: a batch begun ahead
            before a reseed or a state restore, or a batch a pause held half-way when the reseed came.
        stale_batches: batches dropped at hand-out for being more than ``max_policy_lag`` versions behind the
            collector's weights (their frames never handed out).
        lost_workers: workers dropped for good with their restarts spent, collection going on with the others
            (``on_worker_loss="continue"``; the last worker's loss breaks the collector instead, and is not counted).
        env_restarts: envs rebuilt after they raised, with ``env_errors="restart"`` (in this process or in the
            workers, whose processes stay up); each ended the episodes in flight as truncated. A sub-env rebuilt
            alone (its neighbours stepping on) counts one.
        env_restarts_by_sub_env: of those, the sub-envs rebuilt alone: worker id (0 in this process) -> sub-env
            index -> rebuilds.
        inference: for collectors with an inference server (:class:`~acollect.AsyncBatchedCollector`), the
            server's figures (:class:`~acollect.InferenceStats` as a dict); ``None`` otherwise.
        time_split: the fraction of the collecting threads' time (the workers', or the in-process collection
            thread's) over the last 10 seconds spent in each of ``"env"`` (stepping envs), ``"policy"`` (running
            the policy where the envs run), ``"actions"`` (waiting for an inference server's answer with nothing
            else to step), ``"trainer"`` (waiting for the trainer to take batches: no credit left, a slow
            consumer), ``"cpu_wait"`` (runnable, but waiting for a core: Linux's run-queue delay, taken out of the
            parts it happened in; absent where the kernel does not count it) and ``"other"`` (copies,
            bookkeeping, messaging); they sum to 1 (all 0 before the first batch). Time spent paused is left out.
            See :mod:`acollect._time_split` and docs/metrics.md.
        worker_time_split: the same, per worker id.
        bottleneck: what bounds collection now: ``"env"``, ``"policy"``, ``"inference"`` or ``"trainer"``, the
            part of ``time_split`` (``"other"`` aside) with the largest share. A ``"cpu_wait"`` of a fifth or more
            outweighs ``"env"`` and ``"policy"``, and is named ``"trainer_cpu"`` where ``trainer_cores`` is at least
            half the share of its time a collecting thread ran (the trainer is a contender for the cores the
            collecting threads wait for), else ``"cpu"`` (more busy threads than cores: workers, torch threads,
            other jobs). ``None`` until half a second of collecting time was measured, and while paused
            (:func:`acollect._time_split.bottleneck`).
        trainer_cores: the cores the collector's own process kept busy outside its collecting threads (your
            trainer, and the collector's event loop) over the last 10 seconds; ``None`` before two batches, or
            where the kernel does not count threads' CPU time (see ``time_split``'s ``"cpu_wait"``).
        paused: whether a ``pause()`` block holds the collector now; while it does, ``frames_per_s`` and
            ``worker_frames_per_s`` are 0 and no bottleneck is named, and the rates measure afresh after it.
    """

    frames: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    frames_per_s: float = 0.0
    episodes: int = 0
    episode_return_mean: float | None = None
    episode_return_last: float | None = None
    episode_length_mean: float | None = None
    episode_length_last: int | None = None
    group_return_mean: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0
    policy_lag: dict[int, int] = field(default_factory=dict)
    worker_frames_per_s: dict[int, float] = field(default_factory=dict)
    restarts: int = 0
    dropped_batches: int = 0
    discarded_frames: int = 0
    stale_batches: int = 0
    lost_workers: int = 0
    env_restarts: int = 0
    env_restarts_by_sub_env: dict[int, dict[int, int]] = field(default_factory=dict)
    inference: dict[str, Any] | None = None
    time_split: dict[str, float] = field(default_factory=dict)
    worker_time_split: dict[int, dict[str, float]] = field(default_factory=dict)
    bottleneck: str | None = None
    trainer_cores: float | None = None
    paused: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for loggers such as TensorBoard or wandb)."""
        return asdict(self)

    def describe(self, total_frames: int | None = None) -> str:
        """One line: frames (of ``total_frames``), frames/s, episodes, mean return, lag or losses if any, and what
        bounds collection (or that it is paused).

        Examples:
            >>> CollectorStats(frames=2048, frames_per_s=1500.0, episodes=3, episode_return_mean=21.5).describe(4096)
            '2,048/4,096 frames, 1,500 frames/s, 3 episodes, return 21.5'
            >>> CollectorStats(frames=2048, paused=True).describe()
            '2,048 frames, 0 frames/s, 0 episodes, return -, paused'
        """
        ret = "-" if self.episode_return_mean is None else f"{self.episode_return_mean:.4g}"
        of = f"/{total_frames:,}" if total_frames is not None and total_frames > 0 else ""
        parts = [
            f"{self.frames:,}{of} frames",
            f"{self.frames_per_s:,.0f} frames/s",
            f"{self.episodes} episodes",
            f"return {ret}",
        ]
        lag = max(self.policy_lag.values(), default=0)
        if lag:
            parts.append(f"policy lag {lag}")
        if self.restarts or self.dropped_batches:
            parts.append(f"{self.restarts} restarts, {self.dropped_batches} dropped batches")
        if self.lost_workers:
            parts.append(f"{self.lost_workers} lost workers")
        if self.discarded_frames:
            parts.append(f"{self.discarded_frames:,} frames discarded by reseeds")
        if self.env_restarts:
            parts.append(f"{self.env_restarts} env restarts")
        if self.paused:
            parts.append("paused")
        elif self.bottleneck is not None:
            parts.append(self._bound())
        return ", ".join(parts)

    def _bound(self) -> str:
        """The bottleneck in words, with its share and, for a wait for cores, what to do about it.

        Examples:
            >>> split = {"env": 0.2, "cpu_wait": 0.7}
            >>> CollectorStats(time_split=split, bottleneck="cpu")._bound()
            'bound by CPU contention (70% of the collecting time waiting for a core: fewer workers or torch threads)'
        """
        bound = self.bottleneck
        assert bound is not None
        share = f"{self.time_split.get(_SHARE[bound], 0.0):.0%} of the collecting time"
        if bound == "cpu":
            share += " waiting for a core: fewer workers or torch threads"
        elif bound == "trainer_cpu":
            used = f"{self.trainer_cores:.1f}" if self.trainer_cores is not None else "some"
            share += f" waiting for a core while the trainer's process used {used}: leave it a core"
        return f"bound by {_BOUND[bound]} ({share})"

    def __str__(self) -> str:
        return self.describe()


#: The bottleneck in words, and the part of the time split that says it.
_BOUND = {
    "env": "env stepping",
    "policy": "the policy",
    "inference": "waiting for the inference server",
    "trainer": "the trainer",
    "cpu": "CPU contention",
    "trainer_cpu": "the trainer's CPU use",
}
_SHARE = {
    "env": "env",
    "policy": "policy",
    "inference": "actions",
    "trainer": "trainer",
    "cpu": "cpu_wait",
    "trainer_cpu": "cpu_wait",
}


def _mean(values: deque[float] | deque[int]) -> float | None:
    return math.fsum(values) / len(values) if values else None


class _BusyWindow:
    """Cores a process kept busy outside its collecting threads, from readings of the last ``window_s`` seconds.

    Examples:
        >>> w = _BusyWindow(window_s=10.0)
        >>> w.add(1.0, now=0.0); w.add(1.5, now=1.0); w.add(2.5, now=2.0)
        >>> w.cores()
        0.75
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, cpu_s: float, *, now: float) -> None:
        """A reading: CPU seconds so far (the process's, less its collecting threads')."""
        samples = self._samples
        samples.append((now, cpu_s))
        while len(samples) > 2 and samples[1][0] < now - self.window_s:
            samples.popleft()

    def clear(self) -> None:
        self._samples.clear()

    def cores(self) -> float | None:
        """CPU seconds per second between the oldest and newest reading kept (``None`` before two)."""
        if len(self._samples) < 2:
            return None
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return max(0.0, (c1 - c0) / (t1 - t0)) if t1 > t0 else None


def _trainer_cpu_s() -> float:
    """CPU seconds of this process outside its collecting threads (the trainer's, the event loop's)."""
    return time.process_time() - collecting_cpu_s()


class StatsRecorder:
    """Everything :class:`CollectorStats` is made of, fed batch by batch on the collector's event loop.

    A pause (:meth:`pause`, :meth:`resume`) is no time of collecting: while it lasts the snapshot says so with
    rates of 0, the rates measure afresh after it, and each worker's first time report after it has the pause
    taken out of its ``"trainer"`` part (where the worker's stopwatch charged its wait).

    Examples:
        >>> rec = StatsRecorder()
        >>> rec.start(now=0.0); rec.record_batch(100, now=1.0); rec.record_batch(100, now=2.0)
        >>> rec.snapshot(frames=200, batches=2, policy_version=0, now=2.0).frames_per_s
        100.0
        >>> rec.pause(now=3.0)
        >>> snap = rec.snapshot(frames=200, batches=2, policy_version=0, now=25.0)
        >>> snap.paused, snap.frames_per_s
        (True, 0.0)
        >>> rec.resume(now=25.0); rec.record_batch(100, now=26.0)
        >>> rec.snapshot(frames=300, batches=3, policy_version=0, now=26.0).frames_per_s
        100.0
    """

    def __init__(self, *, window_s: float = RATE_WINDOW_S, episode_window: int = EPISODE_WINDOW) -> None:
        self.window_s = window_s
        self.started_at: float | None = None
        self.frames = RateWindow(window_s)
        self.workers: dict[int, RateWindow] = {}
        self.worker_versions: dict[int, int] = {}
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=episode_window)
        self.lengths: deque[int] = deque(maxlen=episode_window)
        self.group_returns: dict[str, deque[float]] = {}
        self._episode_window = episode_window
        self.last_return: float | None = None
        self.last_length: int | None = None
        self.time = TimeSplitWindow(window_s)
        # The trainer's cores are only told apart from the collecting threads' where the kernel counts threads.
        self.busy: _BusyWindow | None = _BusyWindow(window_s) if read_schedstat() is not None else None
        #: when the pause now held began (``None``: not paused)
        self.paused_at: float | None = None
        # Per worker, the seconds of pauses its next time report still has in its "trainer" part.
        self._pause_s: dict[int, float] = {}

    def pause(self, now: float | None = None) -> None:
        """Collection is paused from now (until :meth:`resume`); a second call does nothing."""
        if self.paused_at is None:
            self.paused_at = time.monotonic() if now is None else now

    def resume(self, now: float | None = None) -> None:
        """Collection goes on: the rates measure afresh from now, and the pause is owed back by every worker's
        next time report (see the class's notes)."""
        if self.paused_at is None:
            return
        t = time.monotonic() if now is None else now
        paused = max(0.0, t - self.paused_at)
        self.paused_at = None
        for worker in self.workers:
            self._pause_s[worker] = self._pause_s.get(worker, 0.0) + paused
        if self.started_at is not None:
            self.frames.restart(t)
            for window in self.workers.values():
                window.restart(t)
        if self.busy is not None:
            self.busy.clear()

    def start(self, now: float | None = None) -> None:
        """Marks the start of collection (the origin of the first frame rate); later calls do nothing."""
        if self.started_at is None:
            t = time.monotonic() if now is None else now
            self.started_at = t
            self.frames.add(0, now=t)

    def record_batch(self, frames: int, now: float | None = None) -> None:
        """Counts a batch handed out."""
        t = time.monotonic() if now is None else now
        self.start(t)
        self.frames.add(frames, now=t)

    def record_worker(
        self,
        worker: int,
        frames: int,
        policy_version: int,
        episodes: EpisodeSummary | None = None,
        now: float | None = None,
        time_spent: Sequence[float] | None = None,
    ) -> None:
        """Takes one worker's report on a batch: its frames, the policy version it used, its episodes, and the
        seconds its collecting thread spent in each part since its last batch (:mod:`acollect._time_split`)."""
        t = time.monotonic() if now is None else now
        if time_spent is not None:
            self.time.add(worker, self._without_pause(worker, time_spent), now=t)
        if self.busy is not None:
            self.busy.add(_trainer_cpu_s(), now=t)
        self.start(t)
        window = self.workers.get(worker)
        if window is None:
            window = self.workers[worker] = RateWindow(self.window_s)
            window.add(0, now=self.started_at)
        window.add(frames, now=t)
        self.worker_versions[worker] = policy_version
        if episodes is not None and episodes.count:
            self.episodes += episodes.count
            self.returns.extend(episodes.returns)
            self.lengths.extend(episodes.lengths)
            for group, returns in episodes.groups.items():
                self.group_returns.setdefault(group, deque(maxlen=self._episode_window)).extend(returns)
            if episodes.returns:
                self.last_return = episodes.returns[-1]
                self.last_length = episodes.lengths[-1]

    def _without_pause(self, worker: int, spent: Sequence[float]) -> Sequence[float]:
        """``spent`` less the pauses the worker's stopwatch charged to the trainer since its last report."""
        owed = self._pause_s.pop(worker, 0.0)
        if not owed or len(spent) <= TRAINER:
            return spent
        spent = list(spent)
        spent[TRAINER] -= min(owed, spent[TRAINER])
        return spent

    def snapshot(
        self,
        *,
        frames: int,
        batches: int,
        policy_version: int,
        counters: Mapping[str, Any] | None = None,
        now: float | None = None,
    ) -> CollectorStats:
        """The current :class:`CollectorStats`; ``counters``: the collector's counts, by field name."""
        t = time.monotonic() if now is None else now
        paused = self.paused_at is not None
        trainer_cores = self.busy.cores() if self.busy is not None else None
        stats = CollectorStats(
            frames=frames,
            batches=batches,
            elapsed_s=0.0 if self.started_at is None else t - self.started_at,
            frames_per_s=0.0 if paused else self.frames.rate(),
            episodes=self.episodes,
            episode_return_mean=_mean(self.returns),
            episode_return_last=self.last_return,
            episode_length_mean=_mean(self.lengths),
            episode_length_last=self.last_length,
            group_return_mean={
                group: sum(returns) / len(returns) for group, returns in self.group_returns.items() if returns
            },
            policy_version=policy_version,
            policy_lag={w: policy_version - v for w, v in sorted(self.worker_versions.items())},
            worker_frames_per_s={w: 0.0 if paused else window.rate() for w, window in sorted(self.workers.items())},
            time_split=self.time.split(),
            worker_time_split=self.time.worker_split(),
            bottleneck=None if paused else self.time.bottleneck(trainer_cores=trainer_cores),
            trainer_cores=trainer_cores,
            paused=paused,
        )
        return dataclasses.replace(stats, **counters) if counters else stats
