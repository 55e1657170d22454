"""A task's wait for a descriptor to turn readable, that another call can end early, cheaply.

The collector's endpoint waits on its ZeroMQ descriptor between messages, and any other call on the
socket (a credit sent to a worker) may consume the descriptor's edge, so that call wakes the waiter
to look at the socket again. The obvious tools cost the trainer CPU on every batch: an anyio
deadline scope per wait, and a cancellation to wake it (anyio formats the task's repr each time).

:class:`FdWatch` under asyncio waits on one future that the descriptor's reader callback, a timer (the
deadline) and :meth:`FdWatch.wake` each resolve: no scope, no cancellation. Under any other backend
(trio) it is the portable form: :func:`anyio.wait_readable` in a deadline scope that ``wake`` cancels.
Either way the wait ends at the first of the three, and an outside cancellation passes through.
"""

from __future__ import annotations

import asyncio
import contextlib

import anyio

__all__ = ["FdWatch"]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class FdWatch:
    """One waiter at a time on one descriptor: :meth:`wait` returns when it is readable, woken or timed out.

    Args:
        fd: the descriptor (kept open by its owner until after :meth:`closing`).

    Examples:
        >>> import socket
        >>> async def main():
        ...     left, right = socket.socketpair()
        ...     watch = FdWatch(left.fileno())
        ...     await watch.wait(0.01)  # nothing to read: the deadline ends it
        ...     right.send(b"x")
        ...     await watch.wait(5.0)  # readable: at once
        ...     left.close(), right.close()
        ...     return watch.waiting
        >>> asyncio.run(main())
        False
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # The wait in progress: its future and loop (asyncio), or its scope (any other backend).
        self._future: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scope: anyio.CancelScope | None = None

    @property
    def waiting(self) -> bool:
        """Whether a task waits now."""
        return self._future is not None or self._scope is not None

    async def wait(self, timeout: float) -> None:
        """Returns once the descriptor is readable, :meth:`wake` was called, or ``timeout`` seconds passed.

        Raises:
            RuntimeError: another task waits already.
        """
        if self.waiting:
            raise RuntimeError("FdWatch.wait: another task waits on this descriptor already")
        loop = asyncio._get_running_loop()
        future = loop.create_future() if loop is not None else None
        if loop is not None and future is not None:
            try:
                loop.add_reader(self._fd, _resolve, future)
            except NotImplementedError:  # an asyncio loop without readers (Windows' proactor): the portable form
                loop = None
        if loop is None or future is None:  # not asyncio: the portable form
            with anyio.move_on_after(timeout) as scope:
                self._scope = scope
                try:
                    await anyio.wait_readable(self._fd)
                except anyio.ClosedResourceError:
                    pass  # closing() was called: the caller finds its resource gone
                finally:
                    self._scope = None
            return
        # Registered: from here on the reader is removed however the wait ends.
        self._future, self._loop = future, loop
        timer = loop.call_later(timeout, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            if self._future is future:  # not taken away by closing()
                self._future = None
                loop.remove_reader(self._fd)

    def wake(self) -> None:
        """Ends the wait in progress, if any, as if the descriptor had turned readable."""
        if self._future is not None:
            _resolve(self._future)
        elif self._scope is not None:
            self._scope.cancel()

    def closing(self) -> None:
        """The descriptor is about to be closed: the event loop lets go of it now, and the waiter wakes.

        Called on the event loop's thread, or after the loop ended (then nothing watches the descriptor).
        """
        future, loop, self._future = self._future, self._loop, None
        if future is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is registered with it any more
                loop.remove_reader(self._fd)
                _resolve(future)
        elif self._scope is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing watches the descriptor
                anyio.notify_closing(self._fd)

    def __repr__(self) -> str:
        return f"FdWatch(fd={self._fd}{', waiting' if self.waiting else ''})"
