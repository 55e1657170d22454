"""The event loop an object started on: collectors and inference servers belong to it.

A collector's sockets are watched by one event loop, its tasks run in one task group
on that loop, and its locks and events are bound to it. Used from another loop (a
second ``asyncio.run()``, another thread's loop), it would wait forever on a
descriptor nobody watches. So a collector records :class:`EventLoopRef` of the loop
its set-up ran on, refuses at once every call from another loop, and releases
everything when its own loop ends (see :class:`acollect._runtime.tasks.TaskOwner`).

Examples:
    >>> import asyncio
    >>> async def here():
    ...     return EventLoopRef.current()
    >>> first = asyncio.run(here())
    >>> first.ended, first.backend
    (True, 'asyncio')
    >>> async def compare():
    ...     return first.is_current()
    >>> asyncio.run(compare())
    False
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["EventLoopRef", "current_backend"]


def current_backend() -> str | None:
    """``"asyncio"`` or ``"trio"``: the event loop running in this thread (``None``: none runs)."""
    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
            return "trio"
        except RuntimeError:
            pass
    return None


class EventLoopRef:
    """One running event loop (an asyncio loop, or a trio run through its token), to compare and reach later."""

    __slots__ = ("_loop", "backend")

    def __init__(self, backend: str, loop: Any) -> None:
        self.backend = backend
        self._loop = loop

    @classmethod
    def current(cls) -> EventLoopRef | None:
        """The event loop running in this thread, or ``None`` outside one."""
        backend = current_backend()
        if backend == "asyncio":
            return cls(backend, asyncio.get_running_loop())
        if backend == "trio":
            import trio

            return cls(backend, trio.lowlevel.current_trio_token())
        return None

    def is_current(self) -> bool:
        """Whether this is the event loop running in this thread now."""
        now = EventLoopRef.current()
        return now is not None and now.backend == self.backend and now._loop is self._loop

    @property
    def ended(self) -> bool:
        """Whether the loop can no longer run anything: closed, stopped (asyncio), or its run finished (trio)."""
        if self.backend == "asyncio":
            loop: asyncio.AbstractEventLoop = self._loop
            return loop.is_closed() or not loop.is_running()
        import trio

        try:
            self._loop.run_sync_soon(lambda: None)
        except trio.RunFinishedError:
            return True
        return False

    def submit(self, make: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[float], None]:
        """Runs ``make()`` on this loop from another thread; returns a blocking ``wait(timeout)`` for its end.

        Raises:
            RuntimeError: a trio loop (only an asyncio loop running in another thread can be handed work here).
        """
        if self.backend != "asyncio":
            raise RuntimeError("work can be handed only to an asyncio loop running in another thread")
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        return lambda timeout: future.result(timeout)

    def __repr__(self) -> str:
        state = "ended" if self.ended else "running"
        return f"<{self.backend} event loop {id(self._loop):#x}, {state}>"
