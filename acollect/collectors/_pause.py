"""``pause()``: blocks that nest and overlap across tasks, and the workers stopped while any is held.

The pause count lives in the collector's :class:`~acollect._runtime.lifecycle.Lifecycle` (RUNNING and PAUSED are
its states); :class:`Pauses` brings what collects to it, one task at a time: a pause entered waits for the
background batch in flight to be handed to the replay buffer (workers paused before it arrives would never send
it), then tells the workers to stop; the last pause left tells them to go on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio

from acollect._batches.counts import Counts
from acollect._runtime.lifecycle import CollectorState, Lifecycle
from acollect._runtime.notify import Notifier
from acollect.collectors._background import BackgroundRun
from acollect.collectors._calls import DRAIN_TIMEOUT, Calls
from acollect.stats import CollectorStats

__all__ = ["Pauses"]


class Pauses:
    """The pauses of one collector, and the workers brought to them (see the module's notes).

    Args:
        lifecycle: the collector's state, which counts the pauses held and whether the workers were told.
        calls: the collector's calls in flight (entering a pause is one: a shutdown wakes it).
        run: the background task, whose batch in flight a pause waits for.
        changes: woken when a pause ends (the background task waits for it), and notified by that task.
        counts: the collector's counts (the progress display says "paused").
        stats: the collector's statistics, for that display.
        apply: tells whatever collects to stop (``True``) or go on (``False``): the collector's ``_apply_pause``.
    """

    __slots__ = ("_apply", "_calls", "_changes", "_counts", "_lifecycle", "_lock", "_run", "_stats")

    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        calls: Calls,
        run: BackgroundRun,
        changes: Notifier,
        counts: Counts,
        stats: Callable[[], CollectorStats],
        apply: Callable[[bool], Awaitable[None]],
    ) -> None:
        self._lifecycle = lifecycle
        self._calls = calls
        self._run = run
        self._changes = changes
        self._counts = counts
        self._stats = stats
        self._apply = apply
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """One ``pause()`` block: collection stops until it exits (and every other pause held exits too)."""
        self._calls.check_usable("pause()")
        # Counted before any await, so two tasks entering at once both see the other's pause.
        self._lifecycle.hold_pause()
        try:
            with self._calls.call("pause()"):
                # The background batch in flight is handed over first: workers paused before it
                # arrives would never send it.
                while self._run.busy:
                    await self._changes.wait()
                await self.sync()
            yield
        finally:
            self._lifecycle.release_pause()
            if self._lifecycle.pauses == 0:
                self._changes.notify()
            if not self._lifecycle.closing:
                with anyio.CancelScope(shield=True), anyio.move_on_after(DRAIN_TIMEOUT):
                    await self.sync()

    async def sync(self) -> None:
        """Brings the workers to the wanted pause state (paused iff a pause is held), one task at a time."""
        async with self._lock:
            lifecycle = self._lifecycle
            wanted = lifecycle.pauses > 0
            if lifecycle.state in (CollectorState.RUNNING, CollectorState.PAUSED) and wanted != lifecycle.pause_applied:
                await self._apply(wanted)
                lifecycle.pause_was_applied(wanted)
                self._counts.set_paused(wanted)
                if self._counts.shows_progress:
                    self._counts.show(self._stats())  # the display says "paused" at once, and when it goes on
