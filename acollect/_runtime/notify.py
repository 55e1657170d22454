"""A change notifier: many tasks wait for "something changed", one call wakes them all.

anyio events cannot be cleared, so each notification sets the current event and
drops it (the next waiter makes a fresh one); a waiter re-checks its condition after every wake-up
(and under a deadline), which makes a missed or spurious wake-up harmless.
"""

from __future__ import annotations

import anyio

__all__ = ["Notifier"]


class Notifier:
    """Wakes every task waiting in :meth:`wait`.

    Safe to create outside a running event loop (anyio gives an event adapter then).

    Examples:
        >>> import anyio
        >>> async def main():
        ...     changes, seen = Notifier(), []
        ...     async with anyio.create_task_group() as tg:
        ...         async def waiter():
        ...             await changes.wait()
        ...             seen.append("woken")
        ...         tg.start_soon(waiter)
        ...         await anyio.sleep(0.01)
        ...         changes.notify()
        ...     return seen
        >>> anyio.run(main)
        ['woken']
    """

    def __init__(self) -> None:
        # Made by the first waiter after a notification: most notifications (one per batch and per call) find
        # nobody waiting, and then cost no event.
        self._event: anyio.Event | None = None

    def notify(self) -> None:
        """Wakes every current waiter (later waiters wait for the next notification)."""
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, timeout: float | None = None) -> None:
        """Returns at the next notification, or after ``timeout`` seconds, whichever comes first."""
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        if timeout is None:
            await event.wait()
            return
        with anyio.move_on_after(timeout):
            await event.wait()
