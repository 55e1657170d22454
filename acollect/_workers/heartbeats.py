"""One worker's heartbeats as the collector reads them: when it was last heard from, whether its steps move.

A :class:`Heartbeats` is a part of a :class:`~acollect._workers.handles.WorkerHandle`: the receive loop tells it of
every message and heartbeat (through the handle), and the liveness loop reads it to tell a silent or hung worker from
a live one. It also counts what a worker reports as running totals (frames given up, envs rebuilt), so that each one
is counted once however heartbeats and batches interleave. A new incarnation starts it afresh.

Examples:
    >>> beats = Heartbeats(0)
    >>> beats.on_greeted(now=1.0)
    >>> beats.on_beat({"steps": 4, "busy": True, "discarded": 2}, now=2.0)
    2
    >>> beats.last_steps, beats.last_progress, beats.busy, beats.partial
    (4, 2.0, True, True)
    >>> beats.on_beat({"steps": 4, "busy": False, "partial": True}, now=3.0)  # a batch held by a pause
    0
    >>> beats.busy, beats.partial, beats.last_progress
    (False, True, 2.0)
"""

from __future__ import annotations

import enum
from typing import Any

from acollect.errors import ProtocolError

__all__ = ["Heartbeats"]


class _InHand(enum.Enum):
    """What a worker holds of a batch, per its last heartbeat (``busy`` and ``partial`` in it; busy implies partial)."""

    NOTHING = "nothing"  # no batch begun and not sent
    STEPPING = "stepping"  # stepping a batch (a hung env shows as stepping with no steps)
    HELD = "held"  # a batch begun and not sent, not stepping: held by a pause


class Heartbeats:
    """When one worker was last heard from, its progress and what it holds, from its messages and heartbeats.

    Args:
        worker: the worker's index (its errors name it).
    """

    __slots__ = (
        "_discarded_frames",
        "_env_restarts",
        "_in_hand",
        "_last_beat",
        "_last_progress",
        "_last_steps",
        "_sub_env_restarts",
        "_worker",
    )

    def __init__(self, worker: int) -> None:
        self._worker = worker
        self._last_beat = 0.0
        self._last_steps = -1
        self._last_progress = 0.0
        self._in_hand = _InHand.NOTHING
        self._discarded_frames = 0
        self._env_restarts = 0
        self._sub_env_restarts: dict[int, int] = {}

    @property
    def last_beat(self) -> float:
        """When it was last heard from (any message)."""
        return self._last_beat

    @property
    def last_steps(self) -> int:
        """Env steps taken, per its last heartbeat (``-1`` before one)."""
        return self._last_steps

    @property
    def last_progress(self) -> float:
        """When its step count last moved (or it began a batch)."""
        return self._last_progress

    @property
    def busy(self) -> bool:
        """Whether it is stepping a batch, per its last heartbeat (a hung env shows as busy with no steps)."""
        return self._in_hand is _InHand.STEPPING

    @property
    def partial(self) -> bool:
        """Whether it holds a batch begun and not sent (stepping, or held by a pause): lost if it dies."""
        return self._in_hand is not _InHand.NOTHING

    def on_new_incarnation(self) -> None:
        """A new process takes the slot: its counts start afresh (when it was last heard from is kept until it is
        greeted)."""
        self._last_steps, self._in_hand, self._discarded_frames = -1, _InHand.NOTHING, 0
        self._env_restarts, self._sub_env_restarts = 0, {}

    def on_greeted(self, now: float) -> None:
        """It was greeted: it counts as heard from, and as making progress, from ``now``."""
        self._last_beat = self._last_progress = now

    def on_message(self, now: float) -> None:
        """Anything came from it: it lives."""
        self._last_beat = now

    def on_beat(self, header: dict[str, Any], now: float) -> int:
        """A heartbeat; returns the frames it stepped and gave up since the last one (a held batch it reseeded)."""
        steps, busy = int(header["steps"]), bool(header["busy"])
        if steps != self._last_steps or (busy and not self.busy):
            self._last_steps, self._last_progress = steps, now
        if busy:
            self._in_hand = _InHand.STEPPING
        else:
            self._in_hand = _InHand.HELD if header.get("partial", False) else _InHand.NOTHING
        discarded = int(header.get("discarded", 0))
        newly = max(0, discarded - self._discarded_frames)
        self._discarded_frames = max(self._discarded_frames, discarded)
        return newly

    def on_sub_env_restarts(self, pairs: Any) -> dict[int, int]:
        """The sub-envs its process rebuilt alone so far (``[[sub-env, rebuilds], ...]``, as a heartbeat or a batch
        says); returns the rebuilds not counted yet, by sub-env."""
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(type(x) is int and x >= 0 for x in p) for p in pairs
        ):
            raise ProtocolError(
                f"worker {self._worker} sent sub_env_restarts={pairs!r:.40}: expected [[int, int], ...]"
            )
        newly = {}
        for sub_env, count in pairs:
            seen = self._sub_env_restarts.get(sub_env, 0)
            if count > seen:
                newly[sub_env] = count - seen
                self._sub_env_restarts[sub_env] = count
        return newly

    def on_env_restarts(self, count: Any) -> int:
        """The envs its process rebuilt so far, as a heartbeat or a batch says; returns those not counted yet."""
        if type(count) is not int or count < 0:
            raise ProtocolError(f"worker {self._worker} sent env_restarts={count!r:.20}: expected an int >= 0")
        newly = max(0, count - self._env_restarts)
        self._env_restarts = max(self._env_restarts, count)
        return newly
