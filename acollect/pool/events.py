"""What the pool's parts tell each other and whoever waits on the pool: its failure, its wake-ups, its counts.

:class:`PoolEvents` holds the pool's failure (sticky until the pool is closed) and
wakes every waiter on each change; :class:`Counters` holds what was dropped,
discarded or rejected. The pool makes one of each and hands them to its receive
loop, its liveness loop and its weight pushes, which own nothing else in common.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from acollect._notify import Notifier

__all__ = ["Counters", "PoolEvents"]

logger = logging.getLogger("acollect")
T = TypeVar("T")


@dataclass
class Counters:
    """What the pool counted instead of failing."""

    dropped_batches: int = 0  # batches a dead worker held, or sent after its death
    discarded_frames: int = 0  # stepped and given up on purpose (see Lockstep and the worker's reseed)
    rejected_messages: int = 0  # not from a live worker, or replayed: logged and dropped


class PoolEvents:
    """The pool's failure and its wake-ups: every change wakes whoever waits; a failure is kept and raised.

    Args:
        on_failure: called once, on the event loop, with the pool's failure (the collector breaks).
    """

    def __init__(self, on_failure: Callable[[BaseException], None] | None = None) -> None:
        self.failure: BaseException | None = None
        self.closed = False  # the pool is closing: a failure then is nobody's news
        self._on_failure = on_failure
        self._changes = Notifier()

    def notify(self) -> None:
        """Wakes every waiter: something changed."""
        self._changes.notify()

    def fail(self, exc: BaseException) -> None:
        """Breaks the pool with ``exc`` (the first failure stays), and wakes every waiter."""
        if self.failure is None and not self.closed:
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
