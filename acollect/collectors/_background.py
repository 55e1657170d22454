"""Background mode's parts: the task that fills a replay buffer, and the replay ratio it may hold with a trainer.

``collector.start(replay_buffer=rb)`` runs one task in the collector's task group that collects batch after batch
into ``rb`` (:class:`BackgroundRun` says whether it lives and whether a batch of it is in flight). An off-policy
trainer (DQN, SAC, Dreamer...) wants a *replay ratio*: so many gradient updates per frame collected, whatever
the machine's speed, or its learning curve depends on how fast the envs step. :class:`ReplayRatio` holds it from
both sides, one batch at a time:

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
from collections.abc import Generator
from typing import Any

from acollect._validate import check_int
from acollect.errors import ConfigurationError

__all__ = ["BackgroundRun", "ReplayRatio", "Started"]


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
                "max_frames_ahead", max_frames_ahead,
                f"at least frames_per_update={frames_per_update:g} (else the trainer's next update waits for frames "
                "the collector may not collect)",
            )  # fmt: skip
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
