"""The rules for calling a collector from several tasks: which calls may start, how a waiting call wakes, a failure.

Every public call that waits (entering the collector, iterating, ``pause()``, a weight push that waits for workers
or a server) runs inside :meth:`Calls.call`, which registers a cancel scope that ``async_shutdown()`` (and, unless
the call says otherwise, a failure) cancels, then turns that cancellation into
:class:`~acollect.errors.ClosedCollectorError` (or the failure) for the caller: this one mechanism is how a task
waiting anywhere wakes at shutdown. The rules (``docs/concepts.md``):

* ``async_shutdown()`` may be called from any task, any number of times, at once: every call returns only when
  everything is released, and every task waiting on the collector wakes promptly with ``ClosedCollectorError``.
* Two consumers are served one after the other (a lock, fair in arrival order), never interleaved inside one batch.
* A failure (a worker died, the background task raised) moves the collector to BROKEN at once; waiting calls wake
  with it and later calls raise it, until ``async_shutdown()``.
* A cancelled call leaves nothing behind.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio

from acollect._runtime.lifecycle import CloseReason, CollectorState, Lifecycle
from acollect._runtime.loops import current_backend
from acollect._runtime.notify import Notifier
from acollect._runtime.tasks import CallScope, TaskOwner
from acollect.errors import BackgroundCollectionError, ClosedCollectorError, CollectorStateError

__all__ = ["DRAIN_TIMEOUT", "Calls"]

logger = logging.getLogger("acollect")

_T = TypeVar("_T")

#: Seconds async_shutdown() waits for cancelled calls and tasks to leave before tearing down under them.
#: A collection thread notices its stop event within one env step, so this is only reached by a hung env.
DRAIN_TIMEOUT = 10.0


class Calls:
    """The public calls of one collector in flight, the consumers' turn, and the failure that breaks it.

    Its one writer is the collector that composes it, through the methods below; the collector's
    :class:`~acollect._runtime.lifecycle.Lifecycle` says the state the rules read.

    Args:
        name: the collector's class name, for the messages.
        lifecycle: the collector's state, and the failure that broke it.
        tasks: the collector's task group (whose event loop the collector belongs to).
        changes: woken when a call leaves or a failure lands.
        on_failure: the collector's ``_fail``, where a failure caught in :meth:`checked` goes (it may say what
            the failure stands for, then calls :meth:`fail`).
    """

    __slots__ = ("_changes", "_consumer_lock", "_in_flight", "_lifecycle", "_name", "_on_failure", "_tasks")

    def __init__(
        self,
        name: str,
        lifecycle: Lifecycle,
        tasks: TaskOwner,
        changes: Notifier,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self._name = name
        self._on_failure = on_failure
        self._lifecycle = lifecycle
        self._tasks = tasks
        self._changes = changes
        self._in_flight: set[CallScope] = set()
        self._consumer_lock = anyio.Lock()

    # -- may a call start -------------------------------------------------------------
    def check_usable(self, action: str, *, allow_broken: bool = False) -> None:
        """Raises unless ``action`` may start: the collector is not closed, is used from its own event loop, and
        (unless ``allow_broken``) is not broken (the failure is raised then)."""
        lifecycle = self._lifecycle
        if lifecycle.closing:
            reason = lifecycle.close_reason or CloseReason.SHUTDOWN
            hint = " inside the event loop that uses it" if reason is CloseReason.LOOP_ENDED else ""
            raise ClosedCollectorError(
                f"cannot {action}: this {self._name} is closed ({reason.value}); a closed collector "
                f"cannot be used again: build a new one{hint}"
            )
        self._check_loop(action)
        if lifecycle.state is CollectorState.BROKEN and not allow_broken:
            self.raise_failure()

    def _check_loop(self, action: str) -> None:
        """Raises unless the collector is used from the event loop it started on (or from synchronous code)."""
        owner = self._tasks.loop
        if owner is None or owner.is_current() or current_backend() is None:
            return
        raise CollectorStateError(
            f"cannot {action}: this {self._name} belongs to the event loop it started on ({owner!r}), "
            "not to the one running now. Its sockets, tasks and locks live on that loop: use a collector inside "
            "the asyncio.run() (or trio.run()) that started it, and build a new one for another loop "
            "(`await collector.async_shutdown()` from here releases this one)"
        )

    # -- a failure ----------------------------------------------------------------------
    def raise_failure(self) -> None:
        """Raises the failure that broke the collector (as a ``BackgroundCollectionError`` in background mode)."""
        err = self._lifecycle.report_failure()
        raised = err
        if self._lifecycle.background:
            raised = BackgroundCollectionError(f"background collection failed: {type(err).__name__}: {err}")
            raised.__cause__ = err  # as `raise ... from err`
        context, suppress = raised.__context__, raised.__suppress_context__
        try:
            raise raised
        finally:
            # Callers raise the failure where the failure's own cancellation of their call is being handled
            # (the exit of the call's cancel scope), so the raise chained it to that internal CancelledError:
            # the user would read "Cancelled via cancel scope ... During handling ..." before the real error.
            # The failure keeps the chain it came with, and only that.
            raised.__context__, raised.__suppress_context__ = context, suppress

    def fail(self, exc: BaseException) -> None:
        """A background task or a worker failed: BROKEN now (unless closing or broken already), and every waiting
        call wakes with it."""
        if self._lifecycle.closing or self._lifecycle.failure is not None:
            logger.debug("after the first failure or during shutdown: %s: %s", type(exc).__name__, exc)
            return
        logger.debug("collector broken by %s: %s", type(exc).__name__, exc)
        self._lifecycle.move(CollectorState.BROKEN, failure=exc)
        for call in list(self._in_flight):
            if call.interrupt_on_failure:
                call.scope.cancel()
        self._changes.notify()

    async def checked(self, step: Callable[[], Awaitable[_T]]) -> _T:
        """``await step()`` (collecting, or user code on a batch); its failure breaks the collector and is raised
        here, once."""
        try:
            return await step()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            # An env, policy or worker failed mid-batch: what collects is in no known state.
            self._on_failure(exc)
            failure = self._lifecycle.failure
            if failure is not None and failure is not exc:
                # Broken by another failure first, or by what this one stands for (a worker that
                # lost its inference server reports the server's end): that one is the collector's.
                self.raise_failure()
            if failure is not None:
                self._lifecycle.report_failure()  # raised right here: never again at shutdown
            raise

    # -- a call in flight -----------------------------------------------------------------
    @contextmanager
    def call(self, action: str, *, interrupt_on_failure: bool = True) -> Iterator[None]:
        """Runs a public call so that ``async_shutdown()`` (and a failure) wakes it wherever it waits."""
        self.check_usable(action, allow_broken=not interrupt_on_failure)
        call = CallScope(interrupt_on_failure)
        self._in_flight.add(call)
        try:
            with call.scope:
                yield
        finally:
            self._in_flight.discard(call)
            self._changes.notify()
        if call.scope.cancelled_caught:  # our own scope: only shutdown or a failure cancels it
            if self._lifecycle.state is CollectorState.BROKEN and interrupt_on_failure:
                self.raise_failure()
            raise ClosedCollectorError(f"cannot {action}: async_shutdown() was called while it waited")

    async def take_turn(self) -> None:
        """Takes the consumers' turn (release it with :meth:`end_turn`), at once where it is free under asyncio.

        anyio's lock yields to the event loop even when free: a loop iteration per batch, a tenth of the trainer's
        CPU on a small batch. The call checkpoints anyway where it waits for the batch. A lock held, or waited for,
        is waited for in turn; under trio the lock keeps its checkpoint.
        """
        loop = self._tasks.loop
        if loop is not None and loop.backend == "asyncio":
            try:
                self._consumer_lock.acquire_nowait()
                return
            except anyio.WouldBlock:
                pass
        await self._consumer_lock.acquire()

    def end_turn(self) -> None:
        """The consumer that took the turn is done: the next one waiting goes on."""
        self._consumer_lock.release()

    # -- shutdown ---------------------------------------------------------------------------
    def cancel_all(self) -> None:
        """Shutdown: every call in flight wakes (with ``ClosedCollectorError``)."""
        for call in list(self._in_flight):
            call.scope.cancel()

    async def drain(self) -> None:
        """Waits (up to :data:`DRAIN_TIMEOUT`) for the cancelled calls to leave: the env must be closed only after
        the thread stepping it ended."""
        with anyio.move_on_after(DRAIN_TIMEOUT):
            while self._in_flight:
                await self._changes.wait(0.1)
        if self._in_flight:
            logger.error(
                "%d call(s) did not leave within %.0fs; tearing down under them", len(self._in_flight), DRAIN_TIMEOUT
            )
