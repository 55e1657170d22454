"""The collector's side of its worker processes: one endpoint, one handle per worker, small parts that own their state.

:class:`WorkerPool` starts workers (through a launcher), sends them commands and
closes them within a deadline. It is composed of parts, each given what it needs:
what it knows of each worker (:class:`~acollect._workers.handles.WorkerHandle`), the
the mode every worker is under (:class:`~acollect._workers.handles.WorkerMode`), its failure,
wake-ups and counts (:mod:`~acollect._workers.pool_events`), the receive loop
(:class:`~acollect._workers.receive.Receiver`), the liveness loop and restarts
(:class:`~acollect._workers.liveness.Monitor`), weight pushes
(:class:`~acollect._workers.weight_push.WeightPusher`) and the shared memory the workers write their batches
into (:class:`~acollect._workers.pool_slots.PoolSlots`). The two loops run in the collector's
own task owner (:class:`~acollect._runtime.tasks.TaskOwner`), each in a cancel scope the
pool stops at :meth:`WorkerPool.close`; a loop that raises fails the pool, which
reports to the collector (``on_failure``).

Whoever waits on the pool (:meth:`~acollect._workers.pool_events.PoolEvents.wait_until`) wakes on every event
and re-raises the pool's failure, so a dead worker never leaves the trainer
waiting. A failure is sticky: the pool is broken until it is closed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

import anyio
from tensordict import TensorDictBase

from acollect._batches.shm import shm_available
from acollect._batches.slot_ring import CreditPipeWriter, credit_pipe_path
from acollect._runtime.endpoint import Endpoint
from acollect._runtime.tasks import TaskOwner
from acollect._runtime.threads import run_in_thread
from acollect._runtime.wire import pack_message
from acollect._weights.sync import ZmqWeightSyncScheme
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle, WorkerMode
from acollect._workers.launcher import LaunchedWorker, Launcher
from acollect._workers.liveness import Monitor
from acollect._workers.lockstep_requests import Received
from acollect._workers.pool_events import Counters, PoolEvents, PoolState
from acollect._workers.pool_settings import PoolSettings
from acollect._workers.pool_slots import PoolSlots
from acollect._workers.receive import Receiver
from acollect._workers.weight_push import WeightPusher, default_scheme
from acollect.errors import TransportError

__all__ = ["SHM_THRESHOLD", "WorkerPool"]

logger = logging.getLogger("acollect")

#: Batches at least this large (bytes) go through shared-memory slots by default. Low: a slot costs the
#: collector no decoding and no allocation per batch (its TensorDict of views is built once), where a
#: message's frames are checked and wrapped anew each time; only tiny batches are cheaper as frames.
SHM_THRESHOLD = 1 << 15


def _launch(launcher: Launcher, config: P.WorkerConfig, handle: WorkerHandle, _stop: object) -> LaunchedWorker:
    # Recorded as soon as it exists: a launch cancelled (or failing) half-way still leaves a process
    # that close() knows about and stops, instead of one that outlives the collector.
    process = launcher.start(config)
    handle.on_process(process)
    process.write_config()
    return process


class WorkerPool:
    """Worker processes behind one endpoint.

    Args:
        configs: one config per worker (address and parent pid are filled in here).
        settings: where workers run, the endpoint, credits and slots, deadlines and restarts (one object the
            pool's loops share: :class:`~acollect._workers.pool_settings.PoolSettings`).
        on_failure: called once, on the event loop, with the pool's failure (the collector breaks).
        on_lost: called on the event loop each time a worker is lost (``on_worker_loss="continue"``), with the
            number of workers left.
    """

    #: Whether weights may reach local workers through a shared-memory segment (a pool whose weights travel
    #: by broadcast sends flat buffers instead).
    weights_through_shm: ClassVar[bool] = True

    def __init__(
        self,
        configs: Sequence[P.WorkerConfig],
        settings: PoolSettings,
        *,
        on_failure: Callable[[BaseException], None] | None = None,
        on_lost: Callable[[int], None] | None = None,
    ) -> None:
        self.handles = [WorkerHandle(i, cfg) for i, cfg in enumerate(configs)]
        self._on_lost = on_lost
        self.settings = settings
        self.changes_sent = 0  # P.BOUNDARY messages sent to any worker, ever
        self._batches_asked = 0  # the last lockstep batch asked of any worker (its number; 0: none yet)
        self.endpoint: Endpoint | None = None
        self.ready_queue: deque[Received] = deque()
        self.events = PoolEvents(on_failure)
        self.counters = Counters()
        self.mode = WorkerMode()
        # A push applies from the first lockstep batch no worker was asked for yet (see Lockstep).
        self.weights = WeightPusher(
            self.handles,
            self.events,
            self.send,
            schemes=settings.weight_sync_schemes,
            default_scheme=default_scheme(settings) if self.weights_through_shm else ZmqWeightSyncScheme(),
            max_restarts=settings.max_restarts,
            elastic=settings.elastic,
            first_unasked=lambda: self._batches_asked + 1,
        )
        self._loops: list[tuple[anyio.CancelScope, anyio.Event]] = []  # each loop's scope, and its end
        #: where the workers write their batches: a ring each, or the segments of lockstep batches
        self.slots = PoolSlots(self.handles, settings, self.send, self._wants_shm)

    # -- what its parts hold -----------------------------------------------------------
    @property
    def launcher(self) -> Launcher:
        """Where the workers run (the pool closes it at its end)."""
        return self.settings.launcher

    @property
    def failure(self) -> BaseException | None:
        """The pool's failure (sticky until it is closed), or ``None``."""
        return self.events.failure

    @property
    def sub_env_restarts(self) -> dict[int, dict[int, int]]:
        """Of ``counters.env_restarts``, the sub-envs rebuilt alone: worker -> sub-env -> rebuilds."""
        return {w: dict(counts) for w, counts in self.counters.sub_env_restarts.items()}

    def discard(self, frames: int) -> None:
        """Counts frames stepped and given up on purpose (a part begun ahead before a reseed: see Lockstep)."""
        self.counters.discarded_frames += frames

    @property
    def batches_asked(self) -> int:
        """The number of the last lockstep batch asked of any worker (``0``: none yet)."""
        return self._batches_asked

    def note_asked(self, number: int) -> None:
        """Lockstep batch ``number`` was asked of the workers (a push applies from the first batch asked of none)."""
        self._batches_asked = max(self._batches_asked, number)

    async def order_pause(self, paused: bool) -> None:
        """Tells every ready worker to stop at its next step (``True``) or go on; a restarted one is told at its
        hello. A worker keeps the batch it was stepping, and continues it."""
        self.mode.paused = paused
        if self.endpoint is not None and not self.endpoint.closed:
            await self.broadcast(P.PAUSE if paused else P.RESUME)

    async def order_run(self, credits: int) -> None:
        """Sets every worker collecting on its credits (asynchronous collectors); a restarted one is told at its
        hello."""
        self.mode.running = True
        await self.broadcast(P.RUN, {"credits": credits})

    # -- start -----------------------------------------------------------------------
    async def start(self, owner: TaskOwner) -> None:
        """Binds the endpoint, starts the pool's loops in ``owner``, starts every worker, waits for each hello.

        Safe to cancel at any point: whatever was started is known to :meth:`close`.
        """
        launcher = self.launcher
        if launcher.prepare_on_loop_thread:
            launcher.prepare()
        else:
            await run_in_thread(lambda _stop: launcher.prepare(), name="launcher-prepare")
        settings = self.settings
        address = settings.address if settings.address is not None else launcher.default_address()
        endpoint = self.endpoint = Endpoint(address, keys=settings.keys)
        self.events.starting()
        receiver = Receiver(
            endpoint,
            self.handles,
            self.events,
            self.counters,
            self.ready_queue,
            settings,
            self.weights,
            greet=self._greet,
            batch_data=self._batch_data,
        )
        monitor = Monitor(
            endpoint,
            self.handles,
            self.events,
            self.counters,
            self.mode,
            settings,
            spawn=self._spawn,
            vacate=self._vacate,
            lost=self._lost,
        )
        # A loop that raises (say an OSError while restarting a worker) must not end silently: dead
        # workers would no longer be noticed. It fails the pool instead, and the collector with it.
        for name, loop in (("receiver", receiver), ("monitor", monitor)):
            scope = owner.spawn(loop.run, name=f"pool-{name}", on_failure=self.events.fail)
            self._loops.append((scope, loop.stopped))
        # Slots for workers started by hand open first, before any launch awaits: a worker that connects while the
        # local ones start finds its slot waiting (see Receiver._on_join), not "every remote slot taken".
        for handle in self.handles:
            if handle.config.remote:
                self._vacate(handle)
        for handle in self.handles:
            if not handle.config.remote:
                await self._spawn(handle)
        await self.events.wait_until(lambda: all(h.ready for h in self.handles), what="the workers to start")
        if self.settings.shared_batches is not None:
            await self.slots.lay_out()
        self.events.running()

    async def _greet(self, handle: WorkerHandle) -> None:
        """What a worker is told at its hello: its slots, the last weights, the mode, its outstanding request."""
        assert handle.hello.layout is not None
        if handle.memory.pipe_path is not None:
            try:
                handle.memory.use_credit_pipe(CreditPipeWriter.open(handle.memory.pipe_path))
            except OSError as exc:  # not there (another mount namespace): its credits go as messages
                logger.debug("worker %d's pipe could not be opened (%s): its credits go as messages", handle.index, exc)
        await self.slots.on_hello(handle)
        if self.weights.last is not None:
            fields, td = self.weights.last
            await self.send(handle, P.WEIGHTS, fields, td)
        if self.mode.paused:  # before anything that sets it collecting
            await self.send(handle, P.PAUSE)
        for request in handle.lockstep.requests:  # those its predecessor died on, each into the same rows
            await self.send(handle, P.COLLECT, request.fields())
        if self.mode.running:
            await self.send(handle, P.RUN, {"credits": self.settings.credits or 1})

    async def _batch_data(
        self, handle: WorkerHandle, header: dict[str, Any], td: TensorDictBase | None
    ) -> TensorDictBase | None:
        """A batch's tensors: those of its message (a pool moving them another way overrides this)."""
        return td

    def _lost(self) -> None:
        if self._on_lost is not None:
            self._on_lost(sum(not h.lost for h in self.handles))

    def _vacate(self, handle: WorkerHandle) -> None:
        # A slot for a worker started by hand: the next one to join gets it, under a new generation.
        handle.on_vacate(time.monotonic())

    async def _spawn(self, handle: WorkerHandle) -> None:
        assert self.endpoint is not None
        handle.on_launch(time.monotonic())  # the monitor skips the worker until its process is launched
        config = dataclasses.replace(
            handle.config,
            generation=handle.generation,
            address=self.launcher.connect_address(self.endpoint.address),
            parent_pid=os.getpid(),
            next_traj_counter=handle.batches.traj_counter,
            frames=handle.batches.frames,
            pipe=self._credit_pipe_path(handle),
            # Its own key pair, accepted in memory: it reaches the worker with its config, never a file.
            keys=self.endpoint.local_client_keys() if self.endpoint.secure else None,
        )
        # Off the event loop: a local start writes the config down a pipe, an engine may make a network call.
        await run_in_thread(partial(_launch, self.launcher, config, handle), name="worker-launch")

    def _credit_pipe_path(self, handle: WorkerHandle) -> str | None:
        """Where a worker being launched makes its pipe: on this host only (``None``: credits go as messages)."""
        path = credit_pipe_path() if self.launcher.same_host and not handle.config.remote else None
        handle.memory.make_credit_pipe(path)
        return path

    def _wants_shm(self, nbytes: int) -> bool:
        if not self.launcher.same_host:
            return False  # a worker on another host cannot map this host's memory
        if self.settings.use_shared_memory is not None:
            return self.settings.use_shared_memory and shm_available()
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
        if handle.lost:
            return  # gone for good: what it would be told concerns nobody
        handle.commands.on_send(kind)
        if kind in P.BOUNDARY:  # counted before it goes: the worker counts it on arrival
            self.changes_sent += 1
        generation = handle.generation
        try:
            await self.endpoint.send(handle.identity, pack_message(kind, dict(fields or {}), td), timeout=10.0)
        except TransportError as exc:
            if self.endpoint.closed:
                raise
            if handle.generation != generation:
                return  # restarted meanwhile: the new incarnation is told what matters at its hello
            if handle.on_unreachable(time.monotonic()):  # nothing more is sent to this incarnation
                logger.debug("worker %d cannot be reached (%s): left to the liveness loop", handle.index, exc)
            self.events.notify()

    async def credit(self, handle: WorkerHandle, slot: int | None = None) -> None:
        """A credit to a worker, giving back ``slot`` if not ``None``: down its pipe where it has one (no message,
        no thread woken while it collects: see :mod:`acollect._batches.slot_ring`), else as a ``credit`` message."""
        pipe = handle.memory.pipe
        if pipe is not None and pipe.credit(slot):
            return
        await self.send(handle, P.CREDIT, {"slot": slot})

    async def free(self, handle: WorkerHandle, slot: int) -> None:
        """Gives a worker its ``slot`` back, as :meth:`credit` does (without the credit)."""
        pipe = handle.memory.pipe
        if pipe is not None and pipe.free(slot):
            return
        await self.send(handle, P.FREE, {"slot": slot})

    async def broadcast(self, kind: str, fields: Mapping[str, Any] | None = None) -> None:
        """Sends one command to every ready worker."""
        for handle in self.handles:
            if handle.ready:
                await self.send(handle, kind, fields)

    # -- shutdown ------------------------------------------------------------------------
    async def close(self, limit: float) -> None:
        """``stop``, then SIGTERM, then SIGKILL, all within ``limit`` seconds; releases everything. Idempotent."""
        if not self.events.closing():  # from here no death is restarted: the liveness loop only notes it
            return
        deadline = time.monotonic() + limit
        for scope, _ in self._loops:
            scope.cancel()
        # A restart under way ends first (its launch is shielded): the process it starts is then known here.
        with anyio.move_on_after(max(1.0, 0.2 * limit)):
            for _, stopped in self._loops:
                await stopped.wait()
        live = [h for h in self.handles if h.process is not None and h.process.exitcode is None]
        remote = [h for h in self.handles if h.process is None and h.joined]
        told = [h for h in [*live, *remote] if h.ready or h.joined]  # those that take a ``stop``
        for handle in self.handles:
            handle.on_stopping()
        for handle in live:
            if handle not in told and handle.process is not None:
                # Still booting (it never said hello): it holds no batch and nothing to release, and would
                # only read ``stop`` once its env is built. Ended at once, so a cancelled set-up returns now.
                handle.process.kill()
        if self.endpoint is not None and not self.endpoint.closed:
            for handle in told:
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
        self._release()

    def abandon(self) -> None:
        """Ends every worker and releases everything now, without waiting. Idempotent; never blocks.

        For a collector that can no longer await anything (its event loop ended, or it is garbage collected):
        workers are killed (nothing will read what they collect), the endpoint is closed (``linger=0``) and
        shared memory unlinked. Workers started by hand notice the collector's silence and exit on their own.
        """
        if self.events.state is PoolState.CLOSED:
            return
        self.events.closing()  # (or it was closing already: a close cut short by the end of its event loop)
        for handle in self.handles:
            handle.on_stopping()
            if handle.process is not None:
                handle.process.kill()
                handle.process.close()
        self._release()

    def _release(self) -> None:
        """Frees what the pool holds once its workers ended (or were killed): segments, weights, the endpoint."""
        for handle in self.handles:
            handle.release()
        self.slots.close()
        self.ready_queue.clear()
        self.weights.close()
        if self.endpoint is not None:
            self.endpoint.close()
        self.launcher.close()
        self.events.closed_all()

    @staticmethod
    async def _wait_exit(handles: Sequence[WorkerHandle], deadline: float) -> None:
        while any(h.process is not None and h.process.exitcode is None for h in handles):
            if time.monotonic() >= deadline:
                return
            await anyio.sleep(0.01)
