"""What the pool's parts tell each other and whoever waits on the pool: its state, failure, wake-ups and counts.

:class:`PoolEvents` holds the pool's state (one :class:`PoolState`, moved through
:data:`POOL`, the table ``docs/concepts.md`` shows), its failure (sticky until the pool
is closed) and wakes every waiter on each change; :class:`Counters` holds what was
dropped, discarded or rejected. The pool makes one of each and hands them to its
receive loop, its liveness loop and its weight pushes, which own nothing else in common.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from acollect._runtime.machine import StateTable
from acollect._runtime.notify import Notifier

__all__ = ["POOL", "Counters", "PoolEvents", "PoolState"]

logger = logging.getLogger("acollect")
T = TypeVar("T")


@dataclass
class Counters:
    """What the pool counted instead of failing."""

    dropped_batches: int = 0  # batches a dead worker held, or sent after its death
    discarded_frames: int = 0  # stepped and given up on purpose (see Lockstep and the worker's reseed)
    rejected_messages: int = 0  # not from a live worker, or replayed: logged and dropped
    lost_workers: int = 0  # dropped for good with their restarts spent (on_worker_loss="continue")
    env_restarts: int = 0  # envs a worker rebuilt after they raised (env_errors="restart"), its process staying up
    # of those, the sub-envs rebuilt alone: worker -> sub-env -> rebuilds
    sub_env_restarts: dict[int, dict[int, int]] = dataclasses.field(default_factory=dict)


class PoolState(enum.Enum):
    """Where a worker pool is."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    BROKEN = "broken"
    CLOSING = "closing"
    CLOSED = "closed"


_P = PoolState
POOL: StateTable[PoolState] = StateTable(
    "worker pool",
    {
        _P.NEW: "built: nothing bound or started",
        _P.STARTING: "its endpoint is bound and its loops run; its workers are starting (each says hello)",
        _P.RUNNING: "every worker said hello once (each may be restarted since: see the worker table)",
        _P.BROKEN: "a worker died with its restarts spent, a loop failed or a worker broke the protocol: every wait "
        "on the pool raises that failure",
        _P.CLOSING: "`close()`: no death is restarted any more; workers are told to stop, then ended",
        _P.CLOSED: "every worker ended; sockets, slots and segments released",
    },
    {
        (_P.NEW, _P.STARTING): "`start()`",
        (_P.NEW, _P.CLOSING): "closed before it started",
        (_P.STARTING, _P.RUNNING): "every worker said hello",
        (_P.STARTING, _P.BROKEN): "a worker failed to start with its restarts spent, or a loop failed",
        (_P.STARTING, _P.CLOSING): "closed while starting (a cancelled set-up)",
        (_P.RUNNING, _P.BROKEN): "a worker died with its restarts spent, a loop failed, or a worker broke the protocol",
        (_P.RUNNING, _P.CLOSING): "`close()`",
        (_P.BROKEN, _P.CLOSING): "`close()`",
        (_P.CLOSING, _P.CLOSED): "everything released",
    },
)


class PoolEvents:
    """The pool's state, its failure and its wake-ups: every change wakes whoever waits; a failure is kept and raised.

    Args:
        on_failure: called once, on the event loop, with the pool's failure (the collector breaks).
    """

    def __init__(self, on_failure: Callable[[BaseException], None] | None = None) -> None:
        self._state = PoolState.NEW
        self.failure: BaseException | None = None
        self._on_failure = on_failure
        self._changes = Notifier()

    # -- the state ------------------------------------------------------------------------------
    @property
    def state(self) -> PoolState:
        """Where the pool is."""
        return self._state

    def _move(self, to: PoolState) -> None:
        self._state = POOL.move(self._state, to)
        self.notify()

    @property
    def closed(self) -> bool:
        """Whether the pool is closing or closed: no death is restarted, and a failure then is nobody's news."""
        return self._state in (PoolState.CLOSING, PoolState.CLOSED)

    def starting(self) -> None:
        """``start()`` bound the endpoint and started the loops."""
        self._move(PoolState.STARTING)

    def running(self) -> None:
        """Every worker said hello (a failure during the start leaves the pool broken)."""
        if self._state is PoolState.STARTING:
            self._move(PoolState.RUNNING)

    def closing(self) -> bool:
        """``close()`` begins; returns ``False`` if it began already (the pool closes once)."""
        if self.closed:
            return False
        self._move(PoolState.CLOSING)
        return True

    def closed_all(self) -> None:
        """Everything the pool held is released (idempotent)."""
        if self._state is not PoolState.CLOSED:
            self._move(PoolState.CLOSED)

    def notify(self) -> None:
        """Wakes every waiter: something changed."""
        self._changes.notify()

    def fail(self, exc: BaseException) -> None:
        """Breaks the pool with ``exc`` (the first failure stays), and wakes every waiter."""
        if self.failure is None and self._state in (PoolState.STARTING, PoolState.RUNNING):
            self._move(PoolState.BROKEN)
            self.failure = exc
            # Raised to the caller, who sees it: logging it too would print it twice.
            logger.debug("worker pool failed: %s", exc)
            if self._on_failure is not None:
                self._on_failure(exc)
        self.notify()

    def raise_failure(self) -> None:
        """Raises the pool's failure, if any."""
        if self.failure is not None:
            raise self.failure

    async def wait(self, timeout: float | None = None) -> None:
        """Waits for the next change, at most ``timeout`` seconds."""
        await self._changes.wait(timeout)

    async def wait_until(self, predicate: Callable[[], T], *, limit: float | None = None, what: str = "") -> T:
        """Waits until ``predicate()`` is truthy (re-checked on every change) and returns its value.

        Raises:
            WorkerError: a worker failed meanwhile (the pool's failure).
            TimeoutError: ``limit`` seconds passed first.
        """
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            self.raise_failure()
            value = predicate()
            if value:
                return value
            if deadline is None:
                # The liveness loop notifies every MONITOR_PERIOD: a dead worker wakes this wait too.
                await self._changes.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {limit}s waiting for {what or 'the workers'}")
            await self._changes.wait(remaining)
