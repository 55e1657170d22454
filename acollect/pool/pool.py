"""The collector's side of its worker processes: one endpoint, one task group, one handle per worker.

:class:`WorkerPool` starts workers (through a launcher), sends them commands and
closes them within a deadline. Its jobs are split by module: what it knows of
each worker (:mod:`~acollect.pool.handles`), the receive loop
(:mod:`~acollect.pool.receive`), liveness and restarts
(:mod:`~acollect.pool.liveness`) and weight pushes (:mod:`~acollect.pool.weights`).
The two loops run in one anyio task group that :meth:`WorkerPool.start` opens
inside the collector's own (:class:`~acollect._tasks.TaskOwner`); a loop that
fails fails the pool, which reports to the collector (``on_failure``).

Whoever waits on the pool (:meth:`WorkerPool.wait_until`) wakes on every event
and re-raises the pool's failure, so a dead worker never leaves the trainer
waiting. A failure is sticky: the pool is broken until it is closed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskStatus
from tensordict import TensorDictBase

from acollect._notify import Notifier
from acollect._tasks import TaskOwner
from acollect._threads import run_in_thread
from acollect.errors import TransportError
from acollect.launchers.base import LaunchedWorker, Launcher
from acollect.launchers.local import LocalLauncher
from acollect.pool.handles import Received, WorkerHandle
from acollect.pool.liveness import LivenessMixin
from acollect.pool.receive import ReceiveMixin
from acollect.pool.weights import WeightsMixin
from acollect.transport.auth import ServerKeys
from acollect.transport.endpoint import Endpoint
from acollect.transport.shm import shm_available
from acollect.transport.weight_sync import WeightWriter
from acollect.transport.wire import pack_message
from acollect.worker import protocol as P

__all__ = ["SHM_THRESHOLD", "WorkerPool"]

logger = logging.getLogger("acollect")
T = TypeVar("T")

#: Batches at least this large (bytes) go through shared-memory slots by default. Low: a slot costs the
#: collector no decoding and no allocation per batch (its TensorDict of views is built once), where a
#: message's frames are checked and wrapped anew each time; only tiny batches are cheaper as frames.
SHM_THRESHOLD = 1 << 15


def _launch(launcher: Launcher, config: P.WorkerConfig, handle: WorkerHandle, _stop: object) -> LaunchedWorker:
    # Recorded as soon as it exists: a launch cancelled (or failing) half-way still leaves a process
    # that close() knows about and stops, instead of one that outlives the collector.
    process = handle.process = launcher.start(config)
    process.write_config()
    return process


class WorkerPool(ReceiveMixin, LivenessMixin, WeightsMixin):
    """Worker processes behind one endpoint.

    Args:
        configs: one config per worker (address and parent pid are filled in here).
        start_method: see :mod:`acollect.worker.process`.
        address: endpoint address (``None``: a private ipc path).
        credits: batches each worker may collect ahead (``None``: one batch per ``collect`` request).
        slots: shared-memory slots per worker, where batches go through them (default: ``credits``, or 1).
        use_shared_memory: batches through ``/dev/shm`` slots; ``None`` decides by batch size and address.
        heartbeat_timeout: seconds a collecting worker may make no progress before it counts as hung.
        startup_timeout: seconds a worker may take to build its env and policy.
        max_restarts: restarts allowed per worker before a failure is raised.
        keys: CURVE keys of the endpoint (workers must hold an allowed key to connect).
        launcher: where workers run (default: local processes started with ``start_method``).
        on_failure: called once, on the event loop, with the pool's failure (the collector breaks).
    """

    def __init__(
        self,
        configs: Sequence[P.WorkerConfig],
        *,
        start_method: str,
        address: str | None,
        credits: int | None,
        use_shared_memory: bool | None,
        slots: int | None = None,
        heartbeat_timeout: float,
        startup_timeout: float,
        max_restarts: int,
        keys: ServerKeys | None = None,
        launcher: Launcher | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.handles = [WorkerHandle(i, cfg) for i, cfg in enumerate(configs)]
        self.keys = keys
        self.start_method = start_method
        self.launcher: Launcher = launcher if launcher is not None else LocalLauncher(start_method)
        self.address = address
        self.credits = credits
        self.slots = slots
        self.changes_sent = 0  # P.BOUNDARY messages sent to any worker, ever
        self.use_shared_memory = use_shared_memory
        self.heartbeat_timeout = heartbeat_timeout
        self.startup_timeout = startup_timeout
        self.max_restarts = max_restarts
        self.endpoint: Endpoint | None = None
        self.failure: BaseException | None = None
        self.ready_queue: deque[Received] = deque()
        self.dropped_batches = 0
        self.discarded_frames = 0  # stepped and given up on purpose (see Lockstep and the worker's reseed)
        self.rejected_messages = 0  # not from a live worker, or replayed: logged and dropped
        self.running = False  # ``run`` was sent (asynchronous collectors)
        self.paused = False
        self.version = 0
        self._writers: dict[str, WeightWriter] = {}
        self._last_weights: tuple[dict[str, Any], TensorDictBase | None] | None = None
        self._weights_lock = anyio.Lock()
        self._changes = Notifier()
        self._on_failure = on_failure
        self._stopping = anyio.Event()
        self._run_done = anyio.Event()
        self._running_loops = False
        self._closed = False

    # -- waiting ---------------------------------------------------------------------
    def _notify(self) -> None:
        self._changes.notify()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None and not self._closed:
            self.failure = exc
            # Raised to the caller, who sees it: logging it too would print it twice.
            logger.debug("worker pool failed: %s", exc)
            if self._on_failure is not None:
                self._on_failure(exc)
        self._notify()

    def raise_failure(self) -> None:
        """Raises the pool's failure, if any."""
        if self.failure is not None:
            raise self.failure

    async def wait_until(self, predicate: Callable[[], T], *, limit: float | None = None, what: str = "") -> T:
        """Waits until ``predicate()`` is truthy (re-checked on every event) and returns its value.

        Raises:
            WorkerError: a worker failed meanwhile.
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

    # -- the task group --------------------------------------------------------------
    async def _run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The pool's one task group: the receive and liveness loops, until :meth:`close`."""
        self._running_loops = True
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._guard, self._receive_loop, name="acollect-receiver")
                group.start_soon(self._guard, self._monitor_loop, name="acollect-monitor")
                task_status.started()
                await self._stopping.wait()
                group.cancel_scope.cancel()
        finally:
            self._run_done.set()

    async def _guard(self, loop: Callable[[], Awaitable[None]]) -> None:
        # A loop that raises (say an OSError while restarting a worker) must not end silently: dead
        # workers would no longer be noticed. The pool fails instead, and the collector with it.
        try:
            await loop()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            self._fail(exc)

    # -- start -----------------------------------------------------------------------
    async def start(self, owner: TaskOwner) -> None:
        """Binds the endpoint, opens the pool's task group in ``owner``, starts every worker, waits for each hello.

        Safe to cancel at any point: whatever was started is known to :meth:`close`.
        """
        launcher = self.launcher
        if launcher.prepare_on_loop_thread:
            launcher.prepare()
        else:
            await run_in_thread(lambda _stop: launcher.prepare(), name="launcher-prepare")
        address = self.address if self.address is not None else launcher.default_address()
        self.endpoint = Endpoint(address, keys=self.keys)
        await owner.start(self._run, name="pool")
        for handle in self.handles:
            if handle.config.remote:
                self._vacate(handle)  # started by hand: it joins (see _on_join)
            else:
                await self._spawn(handle)
        await self.wait_until(lambda: all(h.ready for h in self.handles), what="the workers to start")

    def _vacate(self, handle: WorkerHandle) -> None:
        # A slot for a worker started by hand: the next one to join gets it, under a new generation.
        handle.new_incarnation(time.monotonic())
        handle.joined = False

    async def _spawn(self, handle: WorkerHandle) -> None:
        assert self.endpoint is not None
        handle.new_incarnation(time.monotonic())
        config = dataclasses.replace(
            handle.config,
            generation=handle.generation,
            address=self.launcher.connect_address(self.endpoint.address),
            parent_pid=os.getpid(),
            heartbeat_timeout=self.heartbeat_timeout,
            next_traj_counter=handle.traj_counter,
            frames=handle.frames,
            # Its own key pair, accepted in memory: it reaches the worker with its config, never a file.
            keys=self.endpoint.local_client_keys() if self.endpoint.secure else None,
        )
        handle.process = None  # the monitor skips the worker until it is launched
        # Off the event loop: a local start writes the config down a pipe, an engine may make a network call.
        await run_in_thread(partial(_launch, self.launcher, config, handle), name="worker-launch")

    def _wants_shm(self, nbytes: int) -> bool:
        if not self.launcher.same_host:
            return False  # a worker on another host cannot map this host's memory
        if self.use_shared_memory is not None:
            return self.use_shared_memory and shm_available()
        assert self.endpoint is not None
        return nbytes >= SHM_THRESHOLD and shm_available() and not self.endpoint.address.startswith("tcp://")

    # -- messages ------------------------------------------------------------------------
    async def send(
        self, handle: WorkerHandle, kind: str, fields: Mapping[str, Any] | None = None, td: TensorDictBase | None = None
    ) -> None:
        """Sends one command to a worker; a worker that cannot be reached is left to the monitor.

        A worker whose connection is gone (it was killed a moment ago, or is exiting) is dying: that is
        the worker's death, which the liveness loop handles (restart, or the pool's failure), never an
        error for whoever sent. The command is not lost for what matters: a restarted worker is sent the
        outstanding request, the weights, the pause and its credits with its hello.

        Raises:
            TransportError: the pool's own endpoint is closed.
        """
        if self.endpoint is None or self.endpoint.closed:
            raise TransportError("the collector's endpoint is closed")
        if kind in P.BOUNDARY:  # counted before it goes: the worker counts it on arrival
            handle.changes_sent += 1
            self.changes_sent += 1
        if kind in P.RESETS:
            handle.resets_sent += 1
        generation = handle.generation
        try:
            await self.endpoint.send(handle.identity, pack_message(kind, dict(fields or {}), td), timeout=10.0)
        except TransportError as exc:
            if self.endpoint.closed:
                raise
            if handle.generation != generation:
                return  # restarted meanwhile: the new incarnation is told what matters at its hello
            if handle.unreachable_since is None:
                logger.debug("worker %d cannot be reached (%s): left to the liveness loop", handle.index, exc)
                handle.unreachable_since = time.monotonic()
            handle.ready = False  # nothing more is sent to this incarnation
            self._notify()

    async def broadcast(self, kind: str, fields: Mapping[str, Any] | None = None) -> None:
        """Sends one command to every ready worker."""
        for handle in self.handles:
            if handle.ready:
                await self.send(handle, kind, fields)

    # -- shutdown ------------------------------------------------------------------------
    async def close(self, limit: float) -> None:
        """``stop``, then SIGTERM, then SIGKILL, all within ``limit`` seconds; releases everything. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + limit
        for handle in self.handles:
            handle.stopping = True
        self._stopping.set()
        if self._running_loops:
            with anyio.move_on_after(max(1.0, 0.2 * limit)):
                await self._run_done.wait()
        live = [h for h in self.handles if h.process is not None and h.process.exitcode is None]
        remote = [h for h in self.handles if h.process is None and h.joined]
        for handle in live:
            if not handle.ready and handle.process is not None:
                # Still booting (it never said hello): it holds no batch and nothing to release, and would
                # only read ``stop`` once its env is built. Ended at once, so a cancelled set-up returns now.
                handle.process.kill()
        if self.endpoint is not None and not self.endpoint.closed:
            for handle in [*live, *remote]:
                if handle.ready or handle.joined:
                    with anyio.move_on_after(0.2):
                        try:
                            await self.send(handle, P.STOP)
                        except TransportError:
                            pass
            if remote:
                # No exit code to wait for, and the socket drops unsent messages on close (linger 0):
                # give the I/O thread a moment to put each ``stop`` on the wire.
                await anyio.sleep(min(0.5, 0.2 * limit))
        # Most of the time goes to a graceful stop; SIGTERM and SIGKILL get what is left.
        await self._wait_exit(live, deadline - 0.4 * limit)
        for handle in live:
            if handle.process is not None:
                handle.process.terminate()
        await self._wait_exit(live, deadline - 0.1 * limit)
        for handle in live:
            if handle.process is not None:
                handle.process.kill()
        await self._wait_exit(live, max(deadline, time.monotonic() + 1.0))
        for handle in self.handles:
            if handle.process is not None:
                handle.process.close()
            for ring in [*handle.retired_rings, *([handle.ring] if handle.ring is not None else [])]:
                ring.close()
                ring.unlink()
            handle.ring, handle.retired_rings = None, []
            handle.inbox.clear()
        self.ready_queue.clear()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._last_weights = None
        if self.endpoint is not None:
            self.endpoint.close()
        self.launcher.close()

    @staticmethod
    async def _wait_exit(handles: Sequence[WorkerHandle], deadline: float) -> None:
        while any(h.process is not None and h.process.exitcode is None for h in handles):
            if time.monotonic() >= deadline:
                return
            await anyio.sleep(0.01)
