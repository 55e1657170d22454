"""The lifecycle every collector shares, and the rules for calling a collector from several tasks.

A collector is an async iterator of batches and an async resource. This module
owns what does not depend on *where* envs run: the state machine, the one task
group that owns the collector's background tasks (:class:`~acollect._tasks.TaskOwner`),
``total_frames`` accounting, background mode (``start()`` / ``pause()``) and the
rule that a failure is never lost. Subclasses implement ``_setup`` (build what
collects), ``_collect_batch`` (one batch), ``_teardown`` and, where workers must
be told, ``_apply_pause``.

States::

    NEW ──(async with / first batch / start())──▶ RUNNING ◀──▶ PAUSED
     ▲  │                                            │    ╲        │
     └──┘ set-up cancelled or failed:                │     ╲ a background task or a worker failed
          torn down, usable again                    │      ▼
     └───────────────(async_shutdown())──────▶ CLOSING ◀── BROKEN
                                                     │
                                                     ▼
                                                   CLOSED

Calling from several tasks (every collector follows these rules; ``docs/concepts.md``):

* ``async_shutdown()`` may be called from any task, any number of times, at once: every call returns
  only when everything is released, and every task waiting on the collector wakes promptly with
  :class:`~acollect.errors.ClosedCollectorError`.
* Two consumers are served one after the other (a lock, fair in arrival order), never interleaved
  inside one batch.
* ``pause()`` nests and overlaps across tasks: workers stop while any pause is held.
* A failure (a worker died, the background task raised) moves the collector to BROKEN at once;
  waiting calls wake with it and later calls raise it, until ``async_shutdown()``.
* A cancelled call leaves nothing behind; a cancelled set-up is torn down and the collector is NEW
  again (usable), so a retry starts afresh.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol, TypeVar

import anyio
from tensordict import TensorDictBase

from acollect._notify import Notifier
from acollect._tasks import TaskOwner
from acollect._validate import check_seconds
from acollect._warnings import warn
from acollect.collectors._reporting import ReportingMixin
from acollect.errors import (
    BackgroundCollectionError,
    ClosedCollectorError,
    CollectorStateError,
    ConfigurationError,
)

__all__ = ["CollectorBase", "CollectorState", "SupportsExtend"]

logger = logging.getLogger("acollect")

_Collector = TypeVar("_Collector", bound="CollectorBase")

#: Seconds async_shutdown() waits for cancelled calls and tasks to leave before tearing down under them.
#: A collection thread notices its stop event within one env step, so this is only reached by a hung env.
_DRAIN_TIMEOUT = 10.0


class CollectorState(enum.Enum):
    """Where a collector is in its life."""

    NEW = "new"
    RUNNING = "running"
    PAUSED = "paused"
    CLOSING = "closing"
    CLOSED = "closed"
    BROKEN = "broken"


class SupportsExtend(Protocol):
    """Anything a background collector can fill: ``acollect.ReplayBuffer``, torchrl's ``ReplayBuffer``..."""

    def extend(self, data: TensorDictBase, /) -> Any:
        """Adds a batch of transitions."""


def check_total_frames(total_frames: object, frames_per_batch: int) -> int:
    """Validates ``total_frames`` (``-1`` means endless) and warns when it is not a multiple of the batch."""
    if isinstance(total_frames, bool) or not isinstance(total_frames, int) or (
        total_frames <= 0 and total_frames != -1
    ):
        raise ConfigurationError.bad_value("total_frames", total_frames, "a positive int, or -1 for endless collection")
    if total_frames > 0 and total_frames % frames_per_batch:
        # Attributed to the user's line, however many acollect frames lie between (see acollect._warnings).
        warn(
            f"total_frames={total_frames} is not a multiple of frames_per_batch={frames_per_batch}: the last "
            f"batch ends past it, at {math.ceil(total_frames / frames_per_batch) * frames_per_batch} frames."
        )
    return total_frames


class _Call:
    """One public call in flight: its cancel scope, and whether a failure (not only a shutdown) ends it."""

    __slots__ = ("interrupt_on_failure", "scope")

    def __init__(self, interrupt_on_failure: bool) -> None:
        self.scope = anyio.CancelScope()
        self.interrupt_on_failure = interrupt_on_failure


class CollectorBase(ReportingMixin):
    """Shared lifecycle of all collectors (TorchRL calls it ``DataCollectorBase``).

    Subclasses call ``super().__init__(frames_per_batch=..., total_frames=..., progress=...)`` and implement
    ``_setup``, ``_collect_batch`` and ``_teardown``.
    """

    def __init__(self, *, frames_per_batch: int, total_frames: int, progress: bool | str = False) -> None:
        self.frames_per_batch = frames_per_batch
        self.total_frames = check_total_frames(total_frames, frames_per_batch)
        self._init_reporting(progress)
        self._state = CollectorState.NEW
        self._frames = 0
        self._batches = 0
        self._tasks = TaskOwner(type(self).__name__, on_failure=self._fail)
        self._failure: BaseException | None = None
        self._failure_reported = False
        self._calls: set[_Call] = set()
        self._changes = Notifier()  # calls leaving, pauses ending, the background batch handed over
        self._setup_lock = anyio.Lock()
        self._setup_done = False
        self._consumer_lock = anyio.Lock()
        self._pause_lock = anyio.Lock()
        self._pauses = 0
        self._pause_applied = False
        self._background = False  # start() was called
        self._bg_running = False
        self._bg_busy = False
        self._replay_buffer: SupportsExtend | None = None
        self._closed = anyio.Event()
        self._shutdown_limit = 30.0

    # -- subclass hooks ----------------------------------------------------------------
    async def _setup(self) -> None:
        """Builds envs, policies, workers. Runs once, before the first batch; may spawn into ``self._tasks``."""

    async def _collect_batch(self) -> TensorDictBase:
        """Collects and returns one batch."""
        raise NotImplementedError

    async def _teardown(self) -> None:
        """Releases everything ``_setup`` built. Must be safe after a partial, cancelled or failed setup."""

    async def _apply_pause(self, paused: bool) -> None:
        """Tells whatever collects to stop (``True``) or go on (``False``); called with the pause lock held."""

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> CollectorState:
        """The current :class:`CollectorState`."""
        return self._state

    @property
    def frames(self) -> int:
        """Frames handed out so far (a resumed collector continues the count)."""
        return self._frames

    def __len__(self) -> int:
        """Number of batches the collector yields in all; endless collectors have no length."""
        if self.total_frames == -1:
            raise TypeError("an endless collector (total_frames=-1) has no len()")
        return math.ceil(self.total_frames / self.frames_per_batch)

    @property
    def exhausted(self) -> bool:
        """Whether ``total_frames`` were collected."""
        return self.total_frames != -1 and self._frames >= self.total_frames

    def _check_usable(self, action: str, *, allow_broken: bool = False) -> None:
        if self._state in (CollectorState.CLOSING, CollectorState.CLOSED):
            raise ClosedCollectorError(f"cannot {action}: the collector was shut down with async_shutdown()")
        if self._state is CollectorState.BROKEN and not allow_broken:
            self._raise_failure()

    def _raise_failure(self) -> None:
        err = self._failure
        assert err is not None
        self._failure_reported = True
        raised = err
        if self._background:
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

    def _fail(self, exc: BaseException) -> None:
        """A background task or a worker failed: BROKEN now, and every waiting call wakes with it."""
        if self._state in (CollectorState.CLOSING, CollectorState.CLOSED) or self._failure is not None:
            logger.debug("after the first failure or during shutdown: %s: %s", type(exc).__name__, exc)
            return
        logger.debug("collector broken by %s: %s", type(exc).__name__, exc)
        self._failure = exc
        self._state = CollectorState.BROKEN
        for call in list(self._calls):
            if call.interrupt_on_failure:
                call.scope.cancel()
        self._changes.notify()

    @contextmanager
    def _call(self, action: str, *, interrupt_on_failure: bool = True) -> Iterator[None]:
        """Runs a public call so that ``async_shutdown()`` (and a failure) wakes it wherever it waits."""
        self._check_usable(action, allow_broken=not interrupt_on_failure)
        call = _Call(interrupt_on_failure)
        self._calls.add(call)
        try:
            with call.scope:
                yield
        finally:
            self._calls.discard(call)
            self._changes.notify()
        if call.scope.cancelled_caught:  # our own scope: only shutdown or a failure cancels it
            if self._state is CollectorState.BROKEN and interrupt_on_failure:
                self._raise_failure()
            raise ClosedCollectorError(f"cannot {action}: async_shutdown() was called while it waited")

    async def _ensure_setup(self) -> None:
        if self._setup_done:
            return
        async with self._setup_lock:
            if self._setup_done:
                return
            self._check_usable("start collecting")
            self._tasks.ensure_group()
            await self._tasks.started()
            if self._state is CollectorState.NEW:
                self._state = CollectorState.PAUSED if self._pauses else CollectorState.RUNNING
            try:
                await self._setup()
            except BaseException:
                # Cancelled or failed half-way: release what was built (shielded, so a cancellation cannot
                # cut the clean-up short) and be NEW again, so nothing leaks and a retry starts afresh.
                with anyio.CancelScope(shield=True):
                    await self._teardown()
                if self._state in (CollectorState.RUNNING, CollectorState.PAUSED):
                    self._state = CollectorState.NEW
                raise
            self._setup_done = True
            self._stats.start()  # frame rates count from here: building envs and workers is not collecting
        if self._pauses:
            await self._sync_pause()

    # -- async resource ------------------------------------------------------------------
    async def __aenter__(self: _Collector) -> _Collector:
        try:
            with self._call("enter the collector"):  # a shutdown from another task ends the set-up too
                await self._ensure_setup()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.async_shutdown(raise_background_error=False)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.async_shutdown(raise_background_error=exc_info[0] is None)

    async def async_shutdown(self, timeout: float | None = None, *, raise_background_error: bool = True) -> None:
        """Stops collection and releases every resource; any task may call it, any number of times, at once.

        Every call returns only once everything is released (threads, processes, sockets, shared memory).
        Tasks waiting on the collector (a batch, a pause, a weight push) wake with
        :class:`~acollect.errors.ClosedCollectorError`. Safe from any state; shielded from cancellation.

        Args:
            timeout: the whole shutdown's deadline in seconds (default: the collector's own,
                ``shutdown_timeout`` for worker collectors).
            raise_background_error: raise a background failure (``start()``) not reported yet, as
                :class:`~acollect.errors.BackgroundCollectionError`, after everything is released.
        """
        if timeout is not None:
            self._set_shutdown_timeout(check_seconds("timeout", timeout))
        if self._state is CollectorState.CLOSING:
            # Another task is closing: return when it is done (its every step has a deadline).
            with anyio.move_on_after(self._shutdown_limit + 2 * _DRAIN_TIMEOUT):
                await self._closed.wait()
        elif self._state is not CollectorState.CLOSED:
            self._state = CollectorState.CLOSING
            try:
                with anyio.CancelScope(shield=True):
                    await self._close()
            finally:
                self._state = CollectorState.CLOSED
                self._closed.set()
                self._close_progress()
        if raise_background_error and self._background and self._failure is not None and not self._failure_reported:
            self._raise_failure()

    async def _close(self) -> None:
        for call in list(self._calls):
            call.scope.cancel()
        self._tasks.cancel_all()
        # The env must be closed only after the thread stepping it ended: wait for every call to leave.
        with anyio.move_on_after(_DRAIN_TIMEOUT):
            while self._calls:
                await self._changes.wait(0.1)
        if self._calls:
            logger.error("%d call(s) did not leave within %.0fs; tearing down under them", len(self._calls),
                         _DRAIN_TIMEOUT)  # fmt: skip
        await self._teardown()
        await self._tasks.aclose(_DRAIN_TIMEOUT)

    def _set_shutdown_timeout(self, timeout: float) -> None:
        self._shutdown_limit = timeout

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self: _Collector) -> _Collector:
        return self

    async def __anext__(self) -> TensorDictBase:
        batch = None
        with self._call("iterate"):
            if self._background:
                raise CollectorStateError(
                    "cannot iterate a collector that runs in the background (start() was called): "
                    "read from its replay buffer instead"
                )
            if self._state is CollectorState.PAUSED:
                raise CollectorStateError("cannot iterate a paused collector: leave the pause() block first")
            async with self._consumer_lock:  # a second consumer waits its turn (and wakes at shutdown)
                if not self.exhausted:
                    await self._ensure_setup()
                    try:
                        batch = await self._collect_batch()
                    except anyio.get_cancelled_exc_class():
                        raise
                    except Exception as exc:
                        # An env, policy or worker failed mid-batch: what collects is in no known state.
                        self._fail(exc)
                        self._failure_reported = True
                        raise
                    self._count(batch)
        if batch is None:
            raise StopAsyncIteration
        return batch

    # -- background mode -------------------------------------------------------------------
    def start(self, replay_buffer: SupportsExtend | None = None) -> None:
        """Starts collecting in the background, extending ``replay_buffer`` batch after batch.

        Call it from a running event loop (asyncio or trio). The task belongs to the collector's task
        group: it stops at :meth:`async_shutdown`, and its failure is raised at the next call.

        Args:
            replay_buffer: any object with an ``extend(batch)`` method (an :class:`acollect.ReplayBuffer`, a
                torchrl ``ReplayBuffer``...).

        Raises:
            CollectorStateError: the collector was already started, or no event loop runs.
            ConfigurationError: ``replay_buffer`` has no ``extend`` method.
        """
        self._check_usable("start()")
        if self._background:
            raise CollectorStateError("start() was already called on this collector")
        if replay_buffer is None or not callable(getattr(replay_buffer, "extend", None)):
            raise ConfigurationError.bad_value(
                "replay_buffer", replay_buffer, "an object with an extend(batch) method (e.g. acollect.ReplayBuffer)"
            )
        self._tasks.ensure_group()
        self._replay_buffer = replay_buffer
        self._background = self._bg_running = True
        self._tasks.spawn(self._run_background, replay_buffer, name="background")

    @property
    def running_in_background(self) -> bool:
        """Whether a background task started by :meth:`start` is alive."""
        return self._bg_running

    async def _run_background(self, replay_buffer: SupportsExtend) -> None:
        try:
            await self._ensure_setup()
            while not self.exhausted:
                while self._pauses:
                    await self._changes.wait()
                self._bg_busy = True
                try:
                    batch = await self._collect_batch()
                    replay_buffer.extend(batch)
                    self._count(batch)
                finally:
                    self._bg_busy = False
                    self._changes.notify()
        finally:
            self._bg_running = False

    @asynccontextmanager
    async def pause(self) -> AsyncIterator[None]:
        """Stops collection until the block exits; blocks may nest and overlap across tasks.

        Workers stop while any pause is held. In background mode, entering waits for the batch in flight
        to be handed to the replay buffer; inside the block no frame is collected (the buffer stops
        growing).

        Examples:
            >>> async def evaluate(collector):  # doctest: +SKIP
            ...     async with collector.pause():
            ...         ...  # the buffer does not grow here
        """
        self._check_usable("pause()")
        # Counted before any await, so two tasks entering at once both see the other's pause.
        self._pauses += 1
        if self._state is CollectorState.RUNNING:
            self._state = CollectorState.PAUSED
        try:
            with self._call("pause()"):
                # The background batch in flight is handed over first: workers paused before it
                # arrives would never send it.
                while self._bg_busy:
                    await self._changes.wait()
                await self._sync_pause()
            yield
        finally:
            self._pauses -= 1
            if self._pauses == 0:
                if self._state is CollectorState.PAUSED:
                    self._state = CollectorState.RUNNING
                self._changes.notify()
            if self._state not in (CollectorState.CLOSING, CollectorState.CLOSED):
                with anyio.CancelScope(shield=True), anyio.move_on_after(_DRAIN_TIMEOUT):
                    await self._sync_pause()

    async def _sync_pause(self) -> None:
        """Brings the workers to the wanted pause state (paused iff a pause is held), one task at a time."""
        async with self._pause_lock:
            wanted = self._pauses > 0
            if self._setup_done and wanted != self._pause_applied and self._state is not CollectorState.BROKEN:
                await self._apply_pause(wanted)
                self._pause_applied = wanted

    # -- repr --------------------------------------------------------------------------
    def __repr__(self) -> str:
        total = "endless" if self.total_frames == -1 else self.total_frames
        return (
            f"{type(self).__name__}(state={self._state.name}, frames={self._frames}/{total}, "
            f"frames_per_batch={self.frames_per_batch})"
        )
