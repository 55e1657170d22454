"""A collector's lifetime: set up once, closed once, from any task, any number of times, at once, or without waiting.

Set-up runs once, at the first call that needs it (``async with``, the first batch, ``start()``, a weight push),
under a lock: a cancelled or failed set-up is torn down (shielded) and the collector is NEW again, so nothing leaks
and a retry starts afresh; a pause held meanwhile is applied once it is done.

``async_shutdown()`` (and the end of ``async with``, and the end of ``total_frames`` outside one) moves the
collector to CLOSING, cancels every call in flight and every task, waits for the calls to leave, tears down what
set-up built and closes the task group: each step with a deadline, shielded from the caller's cancellation. A
second call waits for the first; a call from another event loop hands the work to the collector's own loop. When
that loop ends with the collector open, or a collector is dropped, everything is released without waiting
(:meth:`Lifetime.abandon`), with a warning, as asyncio does for an unclosed transport.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from acollect._batches.counts import Counts
from acollect._runtime.lifecycle import CloseReason, CollectorState, Lifecycle
from acollect._runtime.tasks import TaskOwner
from acollect._validate import check_seconds
from acollect._warnings import warn_unclosed
from acollect.collectors._calls import DRAIN_TIMEOUT, Calls
from acollect.stats import CollectorStats

if TYPE_CHECKING:
    from acollect.collectors._pause import Pauses

__all__ = ["Lifetime"]

logger = logging.getLogger("acollect")


class Lifetime:
    """The set-up and the shutdown of one collector, and the shutdown's deadline (see the module's notes).

    Args:
        owner: the collector (named in messages, and the source of the warning of one never shut down).
        lifecycle: the collector's state.
        tasks: the collector's task group (opened at set-up, closed last).
        calls: the collector's calls in flight.
        pauses: the collector's pauses (one held during set-up is applied after it).
        counts: the collector's counts (frame rates count from the end of set-up; the progress display is closed
            last).
        stats: the collector's statistics, for that display's last line.
        setup: builds what collects (the collector's ``_setup``).
        teardown: releases what set-up built (awaited, under the shutdown's deadline).
        release_now: releases it without waiting (nothing can be awaited: the loop ended).
        limit: the shutdown's deadline in seconds (``shutdown_timeout`` for worker collectors).
    """

    __slots__ = (
        "_calls",
        "_counts",
        "_lifecycle",
        "_limit",
        "_owner",
        "_pauses",
        "_release_now",
        "_setup",
        "_setup_lock",
        "_stats",
        "_tasks",
        "_teardown",
    )

    def __init__(
        self,
        owner: object,
        *,
        lifecycle: Lifecycle,
        tasks: TaskOwner,
        calls: Calls,
        pauses: Pauses,
        counts: Counts,
        stats: Callable[[], CollectorStats],
        setup: Callable[[], Awaitable[None]],
        teardown: Callable[[], Awaitable[None]],
        release_now: Callable[[], None],
        limit: float = 30.0,
    ) -> None:
        self._owner = owner
        self._lifecycle = lifecycle
        self._tasks = tasks
        self._calls = calls
        self._pauses = pauses
        self._counts = counts
        self._stats = stats
        self._setup = setup
        self._setup_lock = anyio.Lock()
        self._teardown = teardown
        self._release_now = release_now
        self._limit = limit

    async def set_up(self) -> None:
        """Sets the collector up, unless it is already (another task may be doing it: this waits for it)."""
        async with self._setup_lock:
            if self._lifecycle.set_up:
                return
            self._calls.check_usable("start collecting")
            self._tasks.ensure_group()
            await self._tasks.started()
            self._lifecycle.move(CollectorState.STARTING)
            try:
                await self._setup()
            except BaseException:
                # Cancelled or failed half-way: release what was built (shielded, so a cancellation cannot
                # cut the clean-up short) and be NEW again, so nothing leaks and a retry starts afresh.
                with anyio.CancelScope(shield=True):
                    await self._teardown()
                self._lifecycle.setup_undone()
                raise
            self._lifecycle.setup_finished()
            self._counts.stats.start()  # frame rates count from here: building envs and workers is not collecting
        if self._lifecycle.pauses:
            await self._pauses.sync()

    @property
    def limit(self) -> float:
        """The shutdown's deadline in seconds: the last ``async_shutdown(timeout)`` given, else the collector's."""
        return self._limit

    async def shutdown(
        self, reason: CloseReason, timeout: float | None = None, *, raise_background_error: bool
    ) -> None:
        """Closes the collector for ``reason`` (see the module's notes); returns once everything is released.

        ``timeout``: the deadline (kept for later calls); ``raise_background_error``: raise a background failure
        not reported yet, after everything is released.
        """
        if timeout is not None:
            self._limit = check_seconds("timeout", timeout)
        lifecycle = self._lifecycle
        owner = self._tasks.loop
        if owner is not None and not owner.is_current() and lifecycle.state is not CollectorState.CLOSED:
            await self._shutdown_elsewhere(reason)
        elif lifecycle.state is CollectorState.CLOSING:
            # Another task is closing: return when it is done (its every step has a deadline).
            with anyio.move_on_after(self._limit + 2 * DRAIN_TIMEOUT):
                await lifecycle.wait_closed()
        elif lifecycle.state is not CollectorState.CLOSED:
            lifecycle.move(CollectorState.CLOSING, reason=reason)
            try:
                with anyio.CancelScope(shield=True):
                    await self._close()
            finally:
                lifecycle.move(CollectorState.CLOSED)
                self._counts.close_progress(self._stats())
        if (
            raise_background_error
            and lifecycle.background
            and lifecycle.failure is not None
            and (not lifecycle.failure_reported)
        ):
            self._calls.raise_failure()

    async def _shutdown_elsewhere(self, reason: CloseReason) -> None:
        """A shutdown from another event loop than the collector's: its own loop does it, or, gone, nobody waits."""
        owner = self._tasks.loop
        assert owner is not None
        if owner.ended or owner.backend != "asyncio":
            self.abandon(reason, warn=False)  # a trio run in another thread cannot be handed work from here
            return
        wait = owner.submit(lambda: self.shutdown(reason, raise_background_error=False))
        await anyio.to_thread.run_sync(wait, self._limit + 2 * DRAIN_TIMEOUT)

    def abandon(self, reason: CloseReason, *, warn: bool) -> None:
        """Releases everything without waiting (nothing can be awaited on the collector's loop) and closes."""
        lifecycle = self._lifecycle
        if lifecycle.state is CollectorState.CLOSED:
            return
        held = lifecycle.state is not CollectorState.NEW  # NEW: nothing is built (a failed set-up was torn down)
        if lifecycle.state is not CollectorState.CLOSING:
            lifecycle.move(CollectorState.CLOSING, reason=reason)
        name = type(self._owner).__name__
        try:
            if held:
                self._release_now()
        except Exception:  # never from a finalizer: say it, and go on closing
            logger.exception("releasing %s without waiting failed", name)
        finally:
            lifecycle.move(CollectorState.CLOSED)
            self._counts.close_progress(self._stats())
        if warn and held:
            warn_unclosed(
                self._owner,
                f"{name} was never shut down: {reason.value}; its workers were killed and everything it "
                "held released without waiting. Use `async with collector:` or `await collector.async_shutdown()`",
            )

    async def _close(self) -> None:
        self._calls.cancel_all()
        self._tasks.cancel_all()
        # The env must be closed only after the thread stepping it ended: wait for every call to leave.
        await self._calls.drain()
        await self._teardown()
        await self._tasks.aclose(DRAIN_TIMEOUT)
