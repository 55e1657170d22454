"""Background mode: the task that fills a replay buffer, and the replay ratio it may hold with a trainer.

``collector.start(replay_buffer=rb)`` runs one task in the collector's task group that collects batch after batch
into ``rb``: :class:`Background` starts and runs it, and takes the trainer's reports (:class:`BackgroundRun` says
whether it lives and whether a batch of it is in flight). An off-policy trainer (DQN, SAC, Dreamer...) wants a
*replay ratio*: so many gradient updates per frame collected, whatever the machine's speed, or its learning curve
depends on how fast the envs step. :class:`ReplayRatio` holds it from both sides, one batch at a time:

* the collector's task asks for its next batch only while the frames it collected are fewer than
  ``learning_starts + updates * frames_per_update + max_frames_ahead``: it never runs further ahead of the trainer
  (its workers may hold a batch or two collected ahead, as always);
* the trainer, after its updates, reports them, and the call returns once the frames for its next update are in the
  buffer: ``learning_starts + (updates + 1) * frames_per_update``. Two spellings, so that neither reads as the
  other: ``await collector.trained(updates=n)`` says *n more* updates were done (``trained()``: one more;
  ``trained(updates=0)`` before the first update waits for the warm-up), and ``await collector.trained_until(total)``
  says *total* updates were done since ``start()`` (a running total, such as an optimizer's step count). A bare
  ``trained(n)`` is refused: read as a running total, it would add every total to the last and silently break the
  ratio.

A ``frames_per_update`` below 1 asks for several updates per frame (SAC's update-to-data ratio above 1).

``start()`` is a plain call that returns a :class:`Started` handle, already done: ``await collector.start(rb)``, as
an asyncio user may well write it, works too and returns at once (awaiting ``None`` would raise a ``TypeError``
after the task had started).

Examples:
    >>> ratio = ReplayRatio(frames_per_update=4, learning_starts=8, max_frames_ahead=16)
    >>> ratio.collector_may_collect(frames=20), ratio.trainer_may_update(frames=12)
    (True, True)
    >>> ratio.add_updates(10)  # ten more updates done: the eleventh needs 8 + 11 * 4 = 52 frames
    >>> ratio.trainer_may_update(frames=48), ratio.trainer_may_update(frames=52)
    (False, True)
    >>> ratio.collector_may_collect(frames=64)  # 8 + 10 * 4 + 16 = 64: it waits for the trainer
    False
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from tensordict import TensorDictBase

from acollect._validate import check_int
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.replay_buffer import SupportsExtend, extend_from_loop

if TYPE_CHECKING:
    from acollect._batches.counts import Counts
    from acollect._batches.plan import BatchPlan
    from acollect._runtime.lifecycle import Lifecycle
    from acollect._runtime.notify import Notifier
    from acollect._runtime.tasks import TaskOwner
    from acollect.collectors._calls import Calls
    from acollect.collectors._episode_batches import EpisodeBatches
    from acollect.collectors._options import RolloutSettings

__all__ = ["Background", "BackgroundRun", "ReplayRatio", "Started"]


class Started:
    """What ``collector.start(rb)`` returns: the background task already runs, and awaiting this returns at once.

    Examples:
        >>> import asyncio
        >>> async def main():
        ...     return await Started()  # the same as not awaiting it
        >>> asyncio.run(main()) is None
        True
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        # A generator that ends before its first yield: the await completes without suspending, on any event loop.
        return
        yield

    def __repr__(self) -> str:
        return "<background collection started>"


class _Phase(enum.Enum):
    """Where the task ``start()`` spawned is (a batch is in flight only while it lives)."""

    OFF = "off"  # not started, or ended
    WAITING = "waiting"  # alive, between batches (for the replay ratio, a pause, or nothing)
    COLLECTING = "collecting"  # alive, a batch in flight: a pause waits for it to be handed over


class BackgroundRun:
    """The task ``start()`` spawned: whether it is alive, whether a batch of it is in flight, the ratio it holds.

    Its one writer is that task (and ``start()``, which spawns it), through the event methods.

    Examples:
        >>> run = BackgroundRun()
        >>> run.started(None)
        >>> run.batch_begun()
        >>> run.alive, run.busy
        (True, True)
        >>> run.batch_done()
        >>> run.ended()
        >>> run.alive, run.busy
        (False, False)
    """

    __slots__ = ("_phase", "ratio")

    def __init__(self) -> None:
        self._phase = _Phase.OFF
        self.ratio: ReplayRatio | None = None

    @property
    def alive(self) -> bool:
        """Whether the task lives."""
        return self._phase is not _Phase.OFF

    @property
    def busy(self) -> bool:
        """Whether a batch of it is in flight."""
        return self._phase is _Phase.COLLECTING

    def started(self, ratio: ReplayRatio | None) -> None:
        """``start()`` spawns the task, which holds ``ratio``."""
        self._phase, self.ratio = _Phase.WAITING, ratio

    def batch_begun(self) -> None:
        self._phase = _Phase.COLLECTING

    def batch_done(self) -> None:
        """The batch was put in the buffer, or failed (the task ends then)."""
        self._phase = _Phase.WAITING

    def ended(self) -> None:
        self._phase = _Phase.OFF


class ReplayRatio:
    """Frames per trainer update, held within a batch on the collector's side and the trainer's (module notes).

    Args:
        frames_per_update: frames collected per gradient update (> 0; below 1: several updates per frame).
        learning_starts: frames collected before the first update counts (the buffer's warm-up).
        max_frames_ahead: how far the collector may run ahead of the ratio, in frames (at least
            ``frames_per_update``, so that the data of the trainer's next update can always come).

    Raises:
        ConfigurationError: a bad argument (named).
    """

    __slots__ = ("frames_per_update", "learning_starts", "max_frames_ahead", "updates")

    def __init__(self, frames_per_update: float, learning_starts: int = 0, max_frames_ahead: int = 0) -> None:
        if (
            isinstance(frames_per_update, bool)
            or not isinstance(frames_per_update, (int, float))
            or not math.isfinite(frames_per_update)
            or frames_per_update <= 0
        ):
            raise ConfigurationError.bad_value("frames_per_update", frames_per_update, "a finite number > 0")
        self.frames_per_update = float(frames_per_update)
        self.learning_starts = check_int("learning_starts", learning_starts)
        self.max_frames_ahead = check_int("max_frames_ahead", max_frames_ahead)
        if self.max_frames_ahead < self.frames_per_update:
            raise ConfigurationError.bad_value(
                "max_frames_ahead",
                max_frames_ahead,
                f"at least frames_per_update={frames_per_update:g} (else the trainer's next update waits for frames "
                "the collector may not collect)",
            )
        #: gradient updates the trainer reported since ``start()`` (a running total)
        self.updates = 0

    def collector_may_collect(self, frames: int) -> bool:
        """Whether the collector may ask for another batch, having collected ``frames``."""
        return frames < self.learning_starts + self.updates * self.frames_per_update + self.max_frames_ahead

    def trainer_may_update(self, frames: int) -> bool:
        """Whether the frames of the trainer's next update are in: ``frames`` collected so far."""
        return frames >= self.learning_starts + (self.updates + 1) * self.frames_per_update

    def add_updates(self, more: int) -> None:
        """The trainer did ``more`` updates since it last reported."""
        self.updates += more


class Background:
    """Background mode of one collector: ``start()``, the task it spawns, and the trainer's reports (module notes).

    Args:
        lifecycle: the collector's state (background mode is part of it; a pause held stops the task).
        tasks: the collector's task group, where the task runs.
        calls: the collector's calls in flight (a report that waits is one: a shutdown wakes it).
        changes: woken when a batch is handed over or the trainer reports; the task waits on it.
        counts: the collector's counts (frames collected, batches handed out).
        episodes: whole episodes (``trajs_per_batch``), where the task's batches go first when it is set.
        batch: what each batch holds (a replay ratio may run a batch ahead by default).
        settings: the collector's options (asked when the task runs: ``trajs_per_batch``, ``postproc``).
        set_up: the collector's set-up (awaited before the first batch).
        collect: collects one batch (the collector's ``_collect_batch``).
        exhausted: whether ``total_frames`` were collected and handed out.
        count_frames: counts the frames of a batch handed over (toward ``total_frames``).
    """

    __slots__ = (
        "_batch",
        "_calls",
        "_changes",
        "_collect",
        "_count_frames",
        "_counts",
        "_episodes",
        "_exhausted",
        "_lifecycle",
        "_run",
        "_set_up",
        "_settings",
        "_tasks",
    )

    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        tasks: TaskOwner,
        calls: Calls,
        changes: Notifier,
        counts: Counts,
        episodes: EpisodeBatches,
        batch: BatchPlan,
        settings: Callable[[], RolloutSettings],
        set_up: Callable[[], Awaitable[None]],
        collect: Callable[[], Awaitable[TensorDictBase]],
        exhausted: Callable[[], bool],
        count_frames: Callable[[int], None],
    ) -> None:
        self._lifecycle = lifecycle
        self._tasks = tasks
        self._calls = calls
        self._changes = changes
        self._counts = counts
        self._episodes = episodes
        self._batch = batch
        self._settings = settings
        self._set_up = set_up
        self._collect = collect
        self._exhausted = exhausted
        self._count_frames = count_frames
        self._run = BackgroundRun()

    @property
    def run(self) -> BackgroundRun:
        """The task: whether it lives, whether a batch of it is in flight (a pause waits for that one)."""
        return self._run

    @property
    def updates(self) -> int:
        """Gradient updates the trainer reported since ``start()``, in all (0 without a replay ratio)."""
        return self._run.ratio.updates if self._run.ratio is not None else 0

    def start(
        self,
        replay_buffer: SupportsExtend | None,
        frames_per_update: float | None,
        learning_starts: int,
        max_frames_ahead: int | None,
    ) -> Started:
        """The collector's ``start()``: its arguments checked, the task spawned."""
        self._calls.check_usable("start()")
        if self._lifecycle.background:
            raise CollectorStateError("start() was already called on this collector")
        if replay_buffer is None or not callable(getattr(replay_buffer, "extend", None)):
            raise ConfigurationError.bad_value(
                "replay_buffer", replay_buffer, "an object with an extend(batch) method (e.g. acollect.ReplayBuffer)"
            )
        ratio = None
        frames_per_batch = self._batch.frames_per_batch
        if frames_per_update is not None:
            ahead = max_frames_ahead
            if ahead is None:
                try:
                    ahead = max(frames_per_batch, math.ceil(frames_per_update))
                except (TypeError, ValueError, OverflowError):
                    ahead = frames_per_batch  # a bad frames_per_update: ReplayRatio names it
            ratio = ReplayRatio(frames_per_update, learning_starts, ahead)
        elif learning_starts or max_frames_ahead is not None:
            raise ConfigurationError.bad_value(
                "frames_per_update",
                None,
                "a number of frames per update when learning_starts or max_frames_ahead "
                "is given (they are parts of the replay ratio)",
            )
        self._tasks.ensure_group()
        self._lifecycle.enter_background()
        self._run.started(ratio)
        self._tasks.spawn(self._fill, replay_buffer, name="background")
        return Started()

    async def trained(self, positional: Sequence[object], updates: int) -> None:
        """The collector's ``trained()``: ``updates`` more, refused where given by position."""
        if positional:
            given = ", ".join(map(repr, positional))
            raise TypeError(
                f"trained({given}) is ambiguous: trained() takes the number of updates as a keyword. "
                f"`await collector.trained(updates={given})` reports {given} more updates (done since the last "
                f"report); `await collector.trained_until({given})` reports {given} updates in all since start()"
            )
        more = check_int("updates", updates)
        await self._report_updates("trained()", lambda ratio: more)

    async def trained_until(self, total: int) -> None:
        """The collector's ``trained_until()``: a running total, never below the updates already reported."""
        check_int("total", total)

        def more(ratio: ReplayRatio) -> int:
            if total < ratio.updates:
                raise ConfigurationError.bad_value(
                    "total",
                    total,
                    f"at least the {ratio.updates} updates already reported: trained_until() takes the running "
                    "total since start(); trained(updates=n) reports n more",
                )
            return total - ratio.updates

        await self._report_updates("trained_until()", more)

    async def _report_updates(self, call: str, more: Callable[[ReplayRatio], int]) -> None:
        """Adds ``more(ratio)`` updates to the replay ratio; returns once the frames of the next update are in."""
        ratio = self._run.ratio
        if ratio is None:
            raise CollectorStateError(
                "trained() and trained_until() count the updates of a replay ratio: start the collector with "
                "start(replay_buffer, frames_per_update=...)"
            )
        ratio.add_updates(more(ratio))
        self._changes.notify()  # a collector waiting for the trainer may go on
        with self._calls.call(call):
            while not ratio.trainer_may_update(self._counts.frames) and not self._exhausted() and self._run.alive:
                await self._changes.wait()

    async def _fill(self, replay_buffer: SupportsExtend) -> None:
        """The task: batch after batch into ``replay_buffer``, held by a pause or by the replay ratio."""
        try:
            await self._set_up()
            ratio = self._run.ratio
            while not self._exhausted():
                # Held by a pause, or ahead of the replay ratio: the trainer's pause exit or trained() wakes it.
                while self._lifecycle.pauses or (
                    ratio is not None and not ratio.collector_may_collect(self._counts.frames)
                ):
                    await self._changes.wait()
                self._run.batch_begun()
                try:
                    settings = self._settings()
                    if settings.trajs_per_batch is not None:
                        # (no name holds the batch: its lent memory goes back once assembled)
                        await self._episodes.extend(
                            replay_buffer, await self._collect(), settings.trajs_per_batch, settings.postproc
                        )
                        continue
                    batch = await self._collect()
                    with anyio.CancelScope(shield=True):  # a batch that reached the buffer is in it whole, counted
                        await extend_from_loop(replay_buffer, batch)
                        self._count_frames(batch.numel())
                        self._counts.count_batch()
                finally:
                    self._run.batch_done()
                    self._changes.notify()
        finally:
            self._run.ended()
