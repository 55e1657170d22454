"""The one task group that owns a collector's background tasks.

Every task a collector runs besides the caller's own (the worker pool's receive
and liveness loops, the background collection of ``start()``) is spawned here,
in one anyio task group, and each runs in a cancel scope of its own so that
:meth:`TaskOwner.aclose` can stop them all without cancelling anyone else. A task
that fails never fails silently and never tears down its siblings or the caller:
its exception goes to the ``on_failure`` callback (the collector moves to BROKEN
and raises it at the next call), or to the one it was spawned with (the worker
pool's loops report to the pool, which breaks and reports to the collector).

The group is held by a *host* task that the collector starts when it starts
collecting (``async with``, the first batch, or ``start()``) and ends in
``async_shutdown()``: an asyncio task, or a trio system task under trio. A host
rather than the caller's own task holds it because a collector's life is not
one block of one task: it may be entered in one task, iterated lazily, started
from synchronous code, and shut down from any other task, none of which a task
group entered in the caller's task allows. The host catches everything, so it
can never die unnoticed, and every task in it has a deadline to end by.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from acollect._runtime.loops import EventLoopRef
from acollect.errors import CollectorStateError

__all__ = ["CallScope", "TaskOwner"]

logger = logging.getLogger("acollect")

#: Where a task's exception goes.
Failed = Callable[[BaseException], None]


class _Phase(enum.Enum):
    """Where a :class:`TaskOwner` is: tasks can be spawned only while ``HOSTED``."""

    NEW = "new"  # no host task yet (ensure_group() starts it)
    HOSTED = "hosted"  # a host task holds the group (or is opening it: spawned tasks wait for it)
    CLOSED = "closed"  # aclose() was called, or the event loop ended under the host: nothing new starts


class TaskOwner:
    """Owns one anyio task group; spawns tasks into it and stops them all, within deadlines.

    Args:
        name: prefix of the tasks' names (shows in debuggers and task dumps).
        on_failure: called, on the event loop, with the exception of a task that raised.
        on_loop_end: called (synchronously, on the loop) when the event loop ends while the group is open:
            ``asyncio.run()`` cancels every task left when its coroutine returns, and trio cancels system
            tasks when its main task returns. Nothing of the owner's can be awaited after that: it must
            release what it holds without waiting.

    Examples:
        >>> import anyio
        >>> async def main():
        ...     failures = []
        ...     owner = TaskOwner("doc", on_failure=failures.append)
        ...     async def boom():
        ...         raise RuntimeError("lost?")
        ...     owner.ensure_group()        # a host task opens the group
        ...     await owner.started()
        ...     owner.spawn(boom, name="boom")
        ...     await anyio.sleep(0.01)
        ...     await owner.aclose(timeout=1.0)
        ...     return [str(f) for f in failures]
        >>> anyio.run(main)
        ['lost?']
    """

    def __init__(
        self,
        name: str,
        on_failure: Callable[[BaseException], None],
        on_loop_end: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._on_failure = on_failure
        self._on_loop_end = on_loop_end
        #: The event loop the group was opened on (``None`` before): the owner belongs to it.
        self.loop: EventLoopRef | None = None
        self._group: TaskGroup | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._running = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._phase = _Phase.NEW
        # Host mode: the host task holds the group until ``_release`` is set, then sets ``_host_done``. On asyncio
        # the owner keeps a reference to it (a task nobody references may be garbage collected while it runs).
        self._host_task: asyncio.Task[None] | None = None
        self._host_ready = anyio.Event()
        self._release = anyio.Event()
        self._host_done = anyio.Event()
        self._pending: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], anyio.CancelScope, Failed, str]] = []

    # -- where the group lives ---------------------------------------------------------
    def ensure_group(self) -> None:
        """Starts a host task holding the group, unless a group is open already; needs a running loop."""
        if self._phase is _Phase.HOSTED:
            return
        if self._phase is _Phase.CLOSED:
            raise CollectorStateError("the collector's tasks were stopped: it cannot start new ones")
        loop = EventLoopRef.current()
        if loop is None:
            raise CollectorStateError("a collector must be used from a running event loop (asyncio or trio)")
        self.loop = loop
        self._phase = _Phase.HOSTED
        if loop.backend == "asyncio":
            # The one task acollect creates outside a task group: it *is* the group's holder, it catches
            # everything it runs, and aclose() ends it (the reference keeps it from being collected while the
            # collector lives; a collector dropped unclosed goes with it, released by its finalizer).
            self._host_task = asyncio.get_running_loop().create_task(self._run_host(), name=f"{self.name}-tasks")
        else:
            import trio

            # A system task, so the group outlives the caller's nursery scope; aclose() ends it.
            trio.lowlevel.spawn_system_task(self._run_host, name=f"{self.name}-tasks")

    async def started(self) -> None:
        """Waits until the host task opened the group."""
        if self._group is None and self.loop is not None:  # a host task was started (and may be closed since)
            with anyio.fail_after(10.0):
                await self._host_ready.wait()

    async def _run_host(self) -> None:
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                pending, self._pending = self._pending, []
                for fn, args, scope, on_failure, name in pending:
                    group.start_soon(self._guard, fn, args, scope, on_failure, name=f"{self.name}-{name}")
                self._host_ready.set()
                await self._release.wait()
        except anyio.get_cancelled_exc_class():
            # Nobody but the event loop's end cancels the host (aclose() sets _release instead): whatever the
            # owner holds must be released now, without waiting, since nothing can be awaited on this loop later.
            if not self._release.is_set() and self._on_loop_end is not None:
                self._phase = _Phase.CLOSED
                try:
                    self._on_loop_end()
                except Exception:  # the cancellation must go on: the loop is ending
                    logger.exception("releasing %s at the end of its event loop failed", self.name)
            raise
        except BaseException as exc:  # the tasks in it catch their own failures: this is a bug, say it
            logger.error("the task group of %s ended with %s: %s", self.name, type(exc).__name__, exc)
        finally:
            self._group = None
            self._host_ready.set()
            self._host_done.set()

    # -- tasks -------------------------------------------------------------------------
    def spawn(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str, on_failure: Failed | None = None
    ) -> anyio.CancelScope:
        """Runs ``fn(*args)`` in the group; returns the cancel scope that stops it alone.

        ``on_failure``: where the task's exception goes instead of the owner's ``on_failure`` (a part
        with a failure of its own, such as the worker pool, which reports to the collector in turn).
        """
        if self._phase is not _Phase.HOSTED:
            raise CollectorStateError(f"cannot start {name}: the collector's task group is not open")
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        self._running += 1
        self._idle = anyio.Event()
        failed = on_failure if on_failure is not None else self._on_failure
        if self._group is None:  # the host task is starting: it spawns this once its group is open
            self._pending.append((fn, args, scope, failed, name))
        else:
            self._group.start_soon(self._guard, fn, args, scope, failed, name=f"{self.name}-{name}")
        return scope

    async def _guard(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], scope: anyio.CancelScope, on_failure: Failed
    ) -> None:
        try:
            with scope:
                await fn(*args)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # never lost, never fatal to the siblings: the owner decides what it means
            on_failure(exc)
        finally:
            self._done(scope)

    def _done(self, scope: anyio.CancelScope) -> None:
        self._scopes.discard(scope)
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    # -- stopping ------------------------------------------------------------------------
    def cancel_all(self) -> None:
        """Cancels every task (each in its own scope: the caller and the group's host are not cancelled)."""
        for scope in list(self._scopes):
            scope.cancel()

    async def aclose(self, timeout: float) -> None:
        """Cancels every task and waits up to ``timeout`` for them to end; ends the host task. Idempotent.

        Shielded: a cancelled caller still leaves nothing running.
        """
        self._phase = _Phase.CLOSED
        with anyio.CancelScope(shield=True):
            self.cancel_all()
            with anyio.move_on_after(timeout) as scope:
                await self._idle.wait()
            if scope.cancelled_caught:
                logger.error("%d task(s) of %s ignored cancellation for %.1fs", self._running, self.name, timeout)
            if self.loop is not None:  # a host task was started: it lets the group go
                self._release.set()
                with anyio.move_on_after(timeout):
                    await self._host_done.wait()


class CallScope:
    """One public call in flight: its cancel scope, and whether a failure (not only a shutdown) ends it."""

    __slots__ = ("interrupt_on_failure", "scope")

    def __init__(self, interrupt_on_failure: bool) -> None:
        self.scope = anyio.CancelScope()
        self.interrupt_on_failure = interrupt_on_failure
