"""The collector's side of its worker processes.

:class:`WorkerPool` owns the ZeroMQ endpoint, the worker processes, their
shared-memory slots and two asyncio tasks:

* the **receiver** takes every message off the endpoint and files it (batches
  in per-worker inboxes or the first-ready queue, acknowledgements, errors);
* the **monitor** wakes every 0.1 s to check each process's exit code (a dead
  worker is noticed within about that), heartbeat staleness (a hung worker) and
  start-up deadlines, and restarts workers when allowed.

Whoever waits on the pool (:meth:`WorkerPool.wait_until`) wakes on every event
and re-raises the pool's failure, so a dead worker never leaves the trainer
waiting. A failure is sticky: the pool is broken until it is closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import anyio
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._threads import run_in_thread
from acollect.collectors.weight_sync import WeightSyncScheme, WeightWriter
from acollect.errors import (
    ProtocolError,
    RemoteError,
    TransportError,
    WeightSyncError,
    WorkerCrashedError,
    WorkerError,
    WorkerTimeoutError,
)
from acollect.launchers.base import LaunchedWorker, Launcher
from acollect.launchers.local import LocalLauncher
from acollect.transport.auth import ServerKeys
from acollect.transport.endpoint import Endpoint
from acollect.transport.shm import ShmSlotRing, shm_available
from acollect.transport.wire import PROTOCOL_VERSION, pack_message, unpack_message
from acollect.weights import WeightStructure, decode_structure
from acollect.worker import protocol as P
from acollect.worker.process import describe_exit

__all__ = ["SHM_THRESHOLD", "WorkerHandle", "WorkerPool"]

logger = logging.getLogger("acollect")
T = TypeVar("T")

#: Batches at least this large (bytes) go through shared-memory slots by default.
SHM_THRESHOLD = 1 << 18
_MONITOR_PERIOD = 0.1
# ``w<index>.<generation>`` (control socket) or the same plus ``d`` (data socket): see worker_identity.
_IDENTITY = re.compile(rb"w(\d{1,9})\.(\d{1,9})d?")


class _Rejected(Exception):
    """A message that is dropped and counted, not a failure: it did not come from a live worker."""


@dataclass
class Received:
    """One batch as received: its header and data (views into a slot, or over message frames)."""

    worker: int
    generation: int
    header: dict[str, Any]
    data: TensorDictBase
    in_slot: bool


@dataclass
class WorkerHandle:
    """What the collector knows about one worker."""

    index: int
    config: P.WorkerConfig
    process: LaunchedWorker | None = None  # from the pool's launcher
    generation: int = 0
    ready: bool = False
    stopping: bool = False
    started_at: float = 0.0
    n_envs: int = 0
    frames_per_batch: int = 0
    layout: dict[str, Any] | None = None
    ring: ShmSlotRing | None = None
    retired_rings: list[ShmSlotRing] = field(default_factory=list)
    inbox: deque[Received] = field(default_factory=deque)
    outstanding: int = 0  # ``collect`` requests not answered yet
    acked_version: int = 0
    last_beat: float = 0.0
    last_steps: int = -1
    last_progress: float = 0.0
    busy: bool = False
    traj_counter: int = 0
    frames: int = 0
    restarts: int = 0
    next_seq: int = 0  # sequence number of the next batch this incarnation sends
    missing_since: float | None = None  # when a heartbeat first said a batch was sent that has not arrived
    joined: bool = False  # a worker started by hand took this slot (``config.remote``)
    weights_structure: WeightStructure | None = None  # its policy's weights, from hello (None: unknown)
    weights_refused: tuple[int, str] | None = None  # (version, why) of the last push it refused

    @property
    def identity(self) -> bytes:
        return P.worker_identity(self.index, self.generation)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def where(self) -> str:
        """How messages name this worker's process: ``"pid 123"``, ``"Ray actor 1f2e..."``..."""
        return self.process.describe() if self.process is not None else f"pid {self.pid}"


def _launch(launcher: Launcher, config: P.WorkerConfig, handle: WorkerHandle, _stop: object) -> LaunchedWorker:
    # Recorded as soon as it exists: a launch cancelled (or failing) half-way still leaves a process
    # that close() knows about and stops, instead of one that outlives the collector.
    process = handle.process = launcher.start(config)
    process.write_config()
    return process


def _write(writer: WeightWriter, params: TensorDictBase, _stop: object) -> tuple[dict[str, Any], torch.Tensor | None]:
    return writer.write(params)


class WorkerPool:
    """Worker processes behind one endpoint.

    Args:
        configs: one config per worker (address and parent pid are filled in here).
        start_method: see :mod:`acollect.worker.process`.
        address: endpoint address (``None``: a private ipc path).
        credits: batches each worker may collect ahead (``None``: one batch per ``collect`` request).
        use_shared_memory: batches through ``/dev/shm`` slots; ``None`` decides by batch size and address.
        heartbeat_timeout: seconds a collecting worker may make no progress before it counts as hung.
        startup_timeout: seconds a worker may take to build its env and policy.
        max_restarts: restarts allowed per worker before a failure is raised.
        keys: CURVE keys of the endpoint (workers must hold an allowed key to connect).
        launcher: where workers run (default: local processes started with ``start_method``).
    """

    def __init__(
        self,
        configs: Sequence[P.WorkerConfig],
        *,
        start_method: str,
        address: str | None,
        credits: int | None,
        use_shared_memory: bool | None,
        heartbeat_timeout: float,
        startup_timeout: float,
        max_restarts: int,
        keys: ServerKeys | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.handles = [WorkerHandle(i, cfg) for i, cfg in enumerate(configs)]
        self.keys = keys
        self.start_method = start_method
        self.launcher: Launcher = launcher if launcher is not None else LocalLauncher(start_method)
        self.address = address
        self.credits = credits
        self.use_shared_memory = use_shared_memory
        self.heartbeat_timeout = heartbeat_timeout
        self.startup_timeout = startup_timeout
        self.max_restarts = max_restarts
        self.endpoint: Endpoint | None = None
        self.failure: BaseException | None = None
        self.ready_queue: deque[Received] = deque()
        self.dropped_batches = 0
        self.rejected_messages = 0  # not from a live worker, or replayed: logged and dropped
        self.running = False  # ``run`` was sent (asynchronous collectors)
        self.paused = False
        self.version = 0
        self._writers: dict[str, WeightWriter] = {}
        self._last_weights: tuple[dict[str, Any], TensorDictBase | None] | None = None
        self._weights_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # -- waiting ---------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            logger.error("%s", exc)
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
            event = self._changed
            if deadline is None:
                await event.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {limit}s waiting for {what or 'the workers'}")
            with anyio.move_on_after(remaining):
                await event.wait()

    # -- start -----------------------------------------------------------------------
    async def start(self) -> None:
        """Binds the endpoint, starts every worker and waits until all said hello."""
        launcher = self.launcher
        if launcher.prepare_on_loop_thread:
            launcher.prepare()
        else:
            await run_in_thread(lambda _stop: launcher.prepare(), name="launcher-prepare")
        address = self.address if self.address is not None else launcher.default_address()
        self.endpoint = Endpoint(address, keys=self.keys)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._receive_loop(), name="acollect-receiver"),
            loop.create_task(self._monitor_loop(), name="acollect-monitor"),
        ]
        for handle in self.handles:
            if handle.config.remote:
                self._vacate(handle)  # started by hand: it joins (see _on_join)
            else:
                await self._spawn(handle)
        await self.wait_until(lambda: all(h.ready for h in self.handles), what="the workers to start")

    def _vacate(self, handle: WorkerHandle) -> None:
        # A slot for a worker started by hand: the next one to join gets it, under a new generation.
        handle.generation += 1
        handle.ready = handle.joined = False
        handle.acked_version = 0
        handle.last_steps, handle.busy = -1, False
        handle.next_seq, handle.missing_since = 0, None
        handle.started_at = time.monotonic()

    async def _on_join(self, identity: bytes, header: dict[str, Any]) -> None:
        """A worker started by hand (``acollect worker``) asks for a config: give it a free remote slot."""
        from acollect.worker.remote import encode_config

        assert self.endpoint is not None
        handle = next((h for h in self.handles if h.config.remote and not h.joined and not h.stopping), None)
        payload: TensorDictBase | None = None
        if header.get("protocol") != PROTOCOL_VERSION:
            reply: dict[str, Any] = {"refused": f"protocol {header.get('protocol')!r} != {PROTOCOL_VERSION}"}
        elif handle is None:
            reply = {"refused": "every remote worker slot of this collector is taken"}
        else:
            config = dataclasses.replace(
                handle.config,
                generation=handle.generation,
                address=self.endpoint.address,
                parent_pid=0,
                next_traj_counter=handle.traj_counter,
                frames=handle.frames,
            )
            fields, payload = encode_config(config, allow_pickle=bool(header.get("pickle")))
            reply = {"index": handle.index, "generation": handle.generation, **fields}
            handle.joined = True
            handle.started_at = time.monotonic()
            logger.info("worker %d joined from %s (pid %s)", handle.index, header.get("host"), header.get("pid"))
        try:
            await self.endpoint.send(identity, pack_message(P.CONFIG, reply, payload), timeout=1.0)
        except (TransportError, TimeoutError):
            if handle is not None:  # it left already: free the slot again
                handle.joined = False

    async def _spawn(self, handle: WorkerHandle) -> None:
        assert self.endpoint is not None
        handle.generation += 1
        handle.ready = False
        handle.acked_version = 0
        handle.last_steps, handle.busy = -1, False
        handle.next_seq, handle.missing_since = 0, None
        config = dataclasses.replace(
            handle.config,
            generation=handle.generation,
            address=self.launcher.connect_address(self.endpoint.address),
            parent_pid=os.getpid(),
            next_traj_counter=handle.traj_counter,
            frames=handle.frames,
            # Its own key pair, accepted in memory: it reaches the worker with its config, never a file.
            keys=self.endpoint.local_client_keys() if self.endpoint.secure else None,
        )
        handle.started_at = time.monotonic()
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

    async def _on_hello(self, handle: WorkerHandle, header: dict[str, Any]) -> None:
        if header.get("protocol") != PROTOCOL_VERSION:
            raise ProtocolError(f"worker {handle.index} speaks protocol {header.get('protocol')!r}")
        handle.n_envs = int(header["n_envs"])
        handle.frames_per_batch = int(header["frames_per_batch"])
        handle.layout = header["layout"]
        handle.weights_structure = decode_structure(header.get("weights"))
        if handle.ring is not None:
            # A restarted worker gets fresh slots: batches still queued from its predecessor keep theirs.
            handle.retired_rings.append(handle.ring)
            handle.ring = None
        nbytes = sum(int(leaf["nbytes"]) for leaf in header["layout"]["leaves"])
        if not handle.config.remote and self._wants_shm(nbytes):  # a remote worker cannot map our memory
            handle.ring = ShmSlotRing.create(header["layout"], self.credits or 1)
            await self.send(handle, P.SLOTS, {"names": handle.ring.names, "layout": header["layout"]})
        if self._last_weights is not None:
            fields, td = self._last_weights
            await self.send(handle, P.WEIGHTS, fields, td)
        now = time.monotonic()
        handle.last_beat = handle.last_progress = now
        if handle.outstanding:
            await self.send(handle, P.COLLECT)  # the request its predecessor died on
        if self.running:
            await self.send(handle, P.RUN, {"credits": self.credits or 1})
            if self.paused:
                await self.send(handle, P.PAUSE)
        handle.ready = True

    # -- messages ------------------------------------------------------------------------
    async def send(
        self, handle: WorkerHandle, kind: str, fields: Mapping[str, Any] | None = None, td: TensorDictBase | None = None
    ) -> None:
        """Sends one command to a worker; a worker that is gone is left to the monitor."""
        if self.endpoint is None or self.endpoint.closed:
            raise TransportError("the collector's endpoint is closed")
        try:
            await self.endpoint.send(handle.identity, pack_message(kind, dict(fields or {}), td), timeout=10.0)
        except TransportError:
            # An engine (Ray, submitit) learns of a death a little after the worker's socket is gone.
            if handle.process is not None and handle.process.exitcode is None and self.launcher.same_host:
                raise
            # Dead: the monitor reports it (or restarts it, and the restart resends what matters).

    async def broadcast(self, kind: str, fields: Mapping[str, Any] | None = None) -> None:
        """Sends one command to every ready worker."""
        for handle in self.handles:
            if handle.ready:
                await self.send(handle, kind, fields)

    def _sender(self, identity: bytes) -> tuple[WorkerHandle, int] | None:
        """The worker and generation an identity names (``None``: no worker of this pool)."""
        match = _IDENTITY.fullmatch(identity)
        if match is None or int(match[1]) >= len(self.handles):
            return None
        return self.handles[int(match[1])], int(match[2])

    def _reject(self, identity: bytes, reason: BaseException) -> None:
        self.rejected_messages += 1
        logger.warning("rejected a message from %r (%d so far): %s", identity[:64], self.rejected_messages, reason)

    async def _receive_loop(self) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        while True:
            try:
                identity, frames = await endpoint.recv(timeout=1.0)
            except TimeoutError:
                continue
            except TransportError as exc:
                self._fail(exc)
                return
            sender = self._sender(identity)
            if sender is not None and sender[1] < sender[0].generation:
                continue  # from an incarnation that died: its batch was counted as dropped
            # Only a live worker's own sockets can break the pool; anything else that reaches the endpoint
            # (a stray or hostile peer, a replay) is dropped, logged and counted, and collection goes on.
            live = sender is not None and sender[1] == sender[0].generation
            try:
                header, td = unpack_message(frames, kinds=P.TO_COLLECTOR)
                if header["kind"] == P.JOIN:  # a worker started by hand, from a socket of its own
                    await self._on_join(identity, header)
                    continue
                if sender is None or not live:
                    raise _Rejected(f"{header['kind']!r} message from {identity!r:.60}, which is no live worker")
                handle = sender[0]
                if header.get("worker") != handle.index or header.get("gen") != handle.generation:
                    raise ProtocolError(
                        f"worker {handle.index} sent a header naming worker {header.get('worker')!r:.20} "
                        f"generation {header.get('gen')!r:.20}"
                    )
                try:
                    await self._dispatch(handle, header, td)
                except (KeyError, TypeError, ValueError) as exc:
                    what = f"{header['kind']!r} message: {type(exc).__name__}: {exc}"
                    raise ProtocolError(f"worker {handle.index} sent a malformed {what}") from exc
            except _Rejected as exc:
                self._reject(identity, exc)
            except ProtocolError as exc:
                if live:
                    self._fail(exc)
                else:
                    self._reject(identity, exc)
            except (TransportError, WorkerError, TimeoutError) as exc:
                self._fail(exc)
            self._notify()

    async def _dispatch(self, handle: WorkerHandle, header: dict[str, Any], td: TensorDictBase | None) -> None:
        kind = header["kind"]
        now = time.monotonic()
        handle.last_beat = now
        if kind == P.HEARTBEAT:
            steps, busy = int(header["steps"]), bool(header["busy"])
            if steps != handle.last_steps or (busy and not handle.busy):
                handle.last_steps, handle.last_progress = steps, now
            handle.busy = busy
            # Batches travel on another connection than heartbeats, so one may be overtaken; a batch
            # still missing a heartbeat_timeout later was lost (a dropped connection loses what it held).
            if int(header.get("sent", 0)) <= handle.next_seq:
                handle.missing_since = None
            elif handle.missing_since is None:
                handle.missing_since = now
        elif kind == P.BATCH:
            seq = header.get("seq")
            if type(seq) is not int:
                raise ProtocolError(f"worker {handle.index} sent a batch with seq={seq!r:.20}, expected an int")
            if seq < handle.next_seq:
                raise _Rejected(f"replayed batch: seq {seq} from worker {handle.index}, expected {handle.next_seq}")
            if seq > handle.next_seq:
                raise ProtocolError(f"worker {handle.index} sent batch {seq} after {handle.next_seq - 1}: batches lost")
            handle.next_seq += 1
            handle.missing_since = None
            handle.traj_counter = int(header["traj_counter"])
            handle.frames = int(header["frames"])
            slot = header.get("slot")
            if slot is not None:
                if handle.ring is None or type(slot) is not int or not 0 <= slot < len(handle.ring):
                    raise ProtocolError(f"worker {handle.index} named slot {slot!r:.20}, which it does not have")
                data: TensorDictBase = handle.ring[slot].tensordict
            elif td is not None:
                data = td
            else:
                raise ProtocolError(f"worker {handle.index} sent a batch with neither slot nor tensors")
            item = Received(handle.index, handle.generation, header, data, slot is not None)
            if self.credits is None:
                handle.outstanding = max(0, handle.outstanding - 1)
                handle.inbox.append(item)
            else:
                self.ready_queue.append(item)
        elif kind == P.HELLO:
            await self._on_hello(handle, header)
        elif kind == P.ACK:
            if header.get("error") is not None:  # refused: it keeps its weights (see push_weights)
                handle.weights_refused = (int(header["version"]), str(header["error"])[:2000])
                logger.warning("worker %d refused weights version %s: %s", handle.index, *handle.weights_refused)
            else:
                handle.acked_version = max(handle.acked_version, int(header["version"]))
        elif kind == P.ERROR:
            raise RemoteError(
                f"worker {handle.index} ({handle.where}) raised {header.get('type')}: {header.get('message')}",
                worker_id=handle.index,
                type_name=str(header.get("type")),
                remote_traceback=str(header.get("traceback")),
            )

    # -- liveness ------------------------------------------------------------------------
    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(_MONITOR_PERIOD)
            now = time.monotonic()
            for handle in self.handles:
                remote = handle.config.remote  # started by hand: no process handle, liveness from heartbeats only
                if (handle.process is None and not remote) or handle.stopping or self.failure is not None:
                    continue
                code = handle.process.exitcode if handle.process is not None else None
                if code is not None:
                    await self._on_death(handle, WorkerCrashedError(
                        f"worker {handle.index} ({handle.where}) died: {describe_exit(code)}",
                        worker_id=handle.index,
                        exitcode=code,
                    ))  # fmt: skip
                elif not handle.ready:
                    if now - handle.started_at > self.startup_timeout:
                        await self._on_death(handle, WorkerTimeoutError(
                            (f"no remote worker joined as worker {handle.index}" if remote and not handle.joined
                             else f"worker {handle.index} ({handle.where}) did not start")
                            + f" within startup_timeout={self.startup_timeout}s",
                            worker_id=handle.index,
                        ))  # fmt: skip
                elif handle.missing_since is not None and now - handle.missing_since > self.heartbeat_timeout:
                    await self._on_death(handle, WorkerTimeoutError(
                        f"worker {handle.index} ({handle.where}) sent batch {handle.next_seq} more than "
                        f"heartbeat_timeout={self.heartbeat_timeout}s ago and it never arrived: its connection "
                        "to the collector dropped it",
                        worker_id=handle.index,
                    ))  # fmt: skip
                elif now - handle.last_beat > self.heartbeat_timeout:
                    await self._on_death(handle, WorkerTimeoutError(
                        f"worker {handle.index} ({handle.where}) sent no heartbeat for {now - handle.last_beat:.1f}s "
                        f"(heartbeat_timeout={self.heartbeat_timeout}s)",
                        worker_id=handle.index,
                    ))  # fmt: skip
                elif handle.busy and now - handle.last_progress > self.heartbeat_timeout:
                    await self._on_death(handle, WorkerTimeoutError(
                        f"worker {handle.index} ({handle.where}) is hung: no env step for "
                        f"{now - handle.last_progress:.1f}s while collecting "
                        f"(heartbeat_timeout={self.heartbeat_timeout}s)",
                        worker_id=handle.index,
                    ))  # fmt: skip
            self._notify()

    async def _on_death(self, handle: WorkerHandle, error: WorkerError) -> None:
        process = handle.process
        if process is None:  # a remote worker: nothing to kill or restart here, its slot waits for a new one
            if handle.restarts >= self.max_restarts or self._closed:
                self._fail(error)
                return
            handle.restarts += 1
            logger.warning("%s; waiting for a worker to join in its place (%d/%d)", error, handle.restarts,
                           self.max_restarts)  # fmt: skip
            if handle.outstanding or (self.running and handle.busy):
                self.dropped_batches += 1
            self._vacate(handle)
            return
        if handle.restarts >= self.max_restarts or self._closed:
            process.kill()
            self._fail(error)
            return
        handle.restarts += 1
        logger.warning("%s; restarting it (%d/%d)", error, handle.restarts, self.max_restarts)
        process.kill()
        with anyio.move_on_after(2.0):
            while process.exitcode is None:  # noqa: ASYNC110 - an exit code has no event to wait on
                await asyncio.sleep(0.01)
        process.close()
        if handle.outstanding or (self.running and handle.busy):
            self.dropped_batches += 1
        await self._spawn(handle)

    # -- weights -------------------------------------------------------------------------
    async def push_weights(
        self,
        models: Mapping[str, TensorDictBase],
        schemes: Mapping[str, WeightSyncScheme],
        default_scheme: Callable[[], WeightSyncScheme],
        worker_ids: Sequence[int],
        limit: float,
    ) -> int:
        """Serializes ``models`` once, sends them to ``worker_ids`` and waits for every ACK.

        Returns:
            The new policy version.

        Raises:
            WeightSyncError: some workers did not acknowledge within ``limit`` seconds.
        """
        async with self._weights_lock:
            failed = getattr(self.failure, "worker_id", None)
            # A pool broken by one worker still updates the others (they are alive and answer), so the
            # error below names exactly the workers without the weights; any other failure refuses at once.
            if self.failure is not None and not isinstance(failed, int):
                raise WeightSyncError(
                    f"cannot push weights: the collector is broken ({self.failure})",
                    worker_ids=list(worker_ids),
                ) from self.failure
            entries: list[dict[str, Any]] = []
            frames: dict[str, torch.Tensor] = {}
            for i, (model_id, params) in enumerate(models.items()):
                writer = self._writers.get(model_id)
                if writer is None:
                    scheme = schemes.get(model_id) or default_scheme()
                    writer = self._writers[model_id] = scheme.make_writer()
                entry, flat = await run_in_thread(partial(_write, writer, params), name="weights")
                entries.append({"id": model_id, **entry})
                if flat is not None:
                    frames[f"m{i}"] = flat
            self.version += 1
            version = self.version
            fields = {"version": version, "models": entries}
            td = TensorDict(frames, batch_size=[]) if frames else None
            self._last_weights = (fields, td)
            targets = [self.handles[i] for i in worker_ids]
            for handle in targets:
                if handle.ready:
                    await self.send(handle, P.WEIGHTS, fields, td)

            def missing() -> list[int]:
                return [h.index for h in targets if h.acked_version < version]

            def dead() -> list[int]:
                gone = [h.index for h in targets if h.process is not None and h.process.exitcode is not None]
                if self.failure is not None and isinstance(getattr(self.failure, "worker_id", None), int):
                    gone.append(self.failure.worker_id)  # type: ignore[attr-defined]
                return sorted(set(gone))

            deadline = time.monotonic() + limit
            while missing():
                refused = {h.index: h.weights_refused[1] for h in targets
                           if h.weights_refused is not None and h.weights_refused[0] == version}  # fmt: skip
                if refused and set(missing()) <= set(refused):  # every worker answered: no need to wait
                    why = "; ".join(f"worker {i}: {reason}" for i, reason in sorted(refused.items()))
                    raise WeightSyncError(
                        f"weights version {version} were refused by workers {sorted(refused)}, which keep "
                        f"collecting with their previous weights: {why}",
                        worker_ids=sorted(refused),
                    )
                # Without restarts (or once the pool is broken) a dead worker never answers: wait for the live ones.
                restarting = self.max_restarts and self.failure is None
                waiting = missing() if restarting else [i for i in missing() if i not in dead()]
                remaining = deadline - time.monotonic()
                if not waiting or remaining <= 0:
                    why = f"; workers {dead()} are dead" if dead() else ""
                    raise WeightSyncError(
                        f"weights version {version} were not acknowledged by workers {missing()} within {limit}s{why}",
                        worker_ids=missing(),
                    ) from self.failure
                event = self._changed
                with anyio.move_on_after(min(remaining, _MONITOR_PERIOD)):
                    await event.wait()
            return version

    # -- shutdown ------------------------------------------------------------------------
    async def close(self, limit: float) -> None:
        """``stop``, then SIGTERM, then SIGKILL, all within ``limit`` seconds; releases everything. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + limit
        for handle in self.handles:
            handle.stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        live = [h for h in self.handles if h.process is not None and h.process.exitcode is None]
        remote = [h for h in self.handles if h.process is None and h.joined]
        if self.endpoint is not None and not self.endpoint.closed:
            for handle in [*live, *remote]:
                if handle.process is not None or handle.joined:  # one that never said hello may wait for it too
                    with anyio.move_on_after(0.2):
                        try:
                            await self.send(handle, P.STOP)
                        except TransportError:
                            pass
            if remote:
                # No exit code to wait for, and the socket drops unsent messages on close (linger 0):
                # give the I/O thread a moment to put each ``stop`` on the wire.
                await asyncio.sleep(min(0.5, 0.2 * limit))
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
            await asyncio.sleep(0.01)
