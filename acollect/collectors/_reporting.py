"""What a collector reports as it goes: counts, :meth:`stats` and the ``progress=`` display.

The lifecycle (:mod:`acollect.collectors.base`) counts what is handed out; a
subclass reports, per batch and per worker, the policy version and the episodes
that ended (:meth:`ReportingMixin._record_worker`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tensordict import TensorDictBase

from acollect.progress import ProgressReporter, check_progress, make_progress
from acollect.stats import CollectorStats, EpisodeSummary, StatsRecorder

__all__ = ["ReportingMixin"]

logger = logging.getLogger("acollect")


class ReportingMixin:
    """Counters, statistics and the progress display of a collector."""

    total_frames: int
    _frames: int
    _batches: int

    def _init_reporting(self, progress: bool | str) -> None:
        self._progress_kind = check_progress(progress)
        self._progress: ProgressReporter | None = None
        self._stats = StatsRecorder()

    def _count(self, batch: TensorDictBase) -> None:
        """Counts a batch collected and handed out as it is."""
        self._count_batch()
        self._count_frames(batch.numel())

    def _count_batch(self) -> None:
        """Counts a batch handed out (its frames are counted as they are collected, :meth:`_count_frames`)."""
        self._batches += 1

    def _count_frames(self, frames: int) -> None:
        """Counts ``frames`` collected (toward ``total_frames``)."""
        self._frames += frames
        self._stats.record_batch(frames)
        if self._progress_kind is not None:
            if self._progress is None:
                self._progress = make_progress(self._progress_kind, total_frames=self.total_frames,
                                               name=type(self).__name__)  # fmt: skip
            if self._progress is not None:
                self._progress.update(self.stats())

    def _close_progress(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            try:
                progress.close(self.stats())
            except Exception as exc:  # a broken display must not hide how the shutdown went
                logger.warning("closing the progress display failed: %s: %s", type(exc).__name__, exc)

    def stats(self) -> CollectorStats:
        """Progress so far: frames, frames/s, episodes and their returns, policy lag, restarts.

        Cheap to call (no message to any worker): collectors fill it from what comes with each batch.
        Episode returns and lengths are counted over whole episodes, across batch boundaries.

        Examples:
            >>> import anyio
            >>> from acollect import Collector
            >>> from acollect.testing import CountingEnv
            >>> async def main():
            ...     env = lambda: CountingEnv(num_envs=2, episode_length=5)  # reward 1 per step
            ...     async with Collector(env, frames_per_batch=20, total_frames=40) as collector:
            ...         async for _ in collector:
            ...             pass
            ...         return collector.stats()
            >>> stats = anyio.run(main)
            >>> stats.frames, stats.episodes, stats.episode_return_mean, stats.policy_lag
            (40, 8, 5.0, {0: 0})
        """
        return self._stats.snapshot(
            frames=self._frames,
            batches=self._batches,
            policy_version=int(getattr(self, "policy_version", 0)),
            counters=self._counters(),
        )

    def _record_worker(
        self,
        worker: int,
        frames: int,
        policy_version: int,
        episodes: EpisodeSummary | None = None,
        time_spent: Sequence[float] | None = None,
    ) -> None:
        """Hook for subclasses, on the event loop: a worker (``0`` in-process) produced a batch, and says where its
        time went since its last one (``time_spent``, :mod:`acollect.time_split`)."""
        self._stats.record_worker(worker, frames, policy_version, episodes, time_spent=time_spent)

    def _counters(self) -> dict[str, int]:
        """Hook: what a collector counted so far, by :class:`~acollect.CollectorStats` field (``restarts``,
        ``dropped_batches``, ``discarded_frames``, ``stale_batches``...); those left out are 0."""
        return {}
