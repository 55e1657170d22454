"""The pool's receive loop: every message off the endpoint is checked and filed.

:class:`Receiver` is given the endpoint, the worker handles and what it reports to
(the pool's :class:`~acollect._workers.pool_events.PoolEvents` and
:class:`~acollect._workers.pool_events.Counters`). Batches go to per-worker inboxes (lockstep
collectors) or the first-ready queue; hellos, heartbeats, acknowledgements and errors
update the worker's handle, and a hello is answered by the pool's greeting. Only a
live worker's own sockets can break the pool: anything else that reaches the
endpoint (a stray or hostile peer, a replay) is dropped, logged and counted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from tensordict import TensorDictBase

from acollect._runtime.endpoint import Endpoint
from acollect._runtime.wire import PROTOCOL_VERSION, pack_message, unpack_message
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle, WorkerState
from acollect._workers.lockstep_requests import Received
from acollect._workers.pool_events import Counters, PoolEvents
from acollect._workers.pool_settings import PoolSettings
from acollect._workers.weight_push import WeightPusher
from acollect.errors import ProtocolError, RemoteError, TransportError, WorkerError

__all__ = ["Receiver"]

logger = logging.getLogger("acollect")

#: How a batch's tensors are had: from its message (``td``), or another way (see
# acollect._workers.distributed_pool).
BatchData = Callable[[WorkerHandle, dict[str, Any], "TensorDictBase | None"], Awaitable["TensorDictBase | None"]]


class Receiver:
    """The pool's receive loop (:meth:`run`): reads the endpoint, files what comes, reports what goes wrong.

    Args:
        endpoint: the pool's endpoint.
        handles: the pool's workers, by index.
        events: where a failure goes and every change is told.
        counters: where dropped batches, discarded frames and rejected messages are counted.
        ready_queue: where batches go first ready, first served (``settings.credits`` set); else each worker's inbox.
        settings: the pool's settings (:class:`~acollect._workers.pool_settings.PoolSettings`).
        weights: the pool's weight pusher, which the workers' answers to its pushes go to.
        greet: answers a worker's hello (slots, weights, the mode, its outstanding request), once its
            handle holds what the hello said.
        batch_data: a batch's tensors (default: those of its message).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        handles: Sequence[WorkerHandle],
        events: PoolEvents,
        counters: Counters,
        ready_queue: deque[Received],
        settings: PoolSettings,
        weights: WeightPusher,
        *,
        greet: Callable[[WorkerHandle], Awaitable[None]],
        batch_data: BatchData | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.handles = handles
        self.events = events
        self.counters = counters
        self.ready_queue = ready_queue
        self.settings = settings
        self.weights = weights
        self._greet = greet
        self._batch_data = batch_data
        self.stopped = anyio.Event()  # set once run() ended, however

    async def run(self) -> None:
        """Receives until cancelled, or until the endpoint fails (the pool's failure)."""
        try:
            await self._loop()
        finally:
            self.stopped.set()

    async def _on_join(self, identity: bytes, header: dict[str, Any]) -> None:
        """A worker started by hand (``acollect worker``) asks for a config: give it a free remote slot."""
        from acollect._workers.config_codec import encode_config

        assert self.endpoint is not None
        handle = next((h for h in self.handles if h.config.remote and h.state is WorkerState.VACANT), None)
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
                next_traj_counter=handle.batches.traj_counter,
                frames=handle.batches.frames,
            )
            fields, payload = encode_config(config, allow_pickle=bool(header.get("pickle")))
            reply = {"index": handle.index, "generation": handle.generation, **fields}
            handle.on_join(time.monotonic())
            logger.info("worker %d joined from %s (pid %s)", handle.index, header.get("host"), header.get("pid"))
        try:
            await self.endpoint.send(identity, pack_message(P.CONFIG, reply, payload), timeout=1.0)
        except (TransportError, TimeoutError):
            if handle is not None:  # it left already: free the slot again
                handle.on_join_failed()

    async def _on_hello(self, handle: WorkerHandle, header: dict[str, Any]) -> None:
        if header.get("protocol") != PROTOCOL_VERSION:
            raise ProtocolError(f"worker {handle.index} speaks protocol {header.get('protocol')!r}")
        handle.on_hello(header)
        await self._greet(handle)
        handle.on_greeted(time.monotonic())

    def _sender(self, identity: bytes) -> tuple[WorkerHandle, int] | None:
        """The worker and generation an identity names (``None``: no worker of this pool)."""
        parsed = P.parse_identity(identity)
        if parsed is None or parsed[0] >= len(self.handles):
            return None
        return self.handles[parsed[0]], parsed[1]

    def _on_late(self, handle: WorkerHandle, generation: int, frames: list[Any]) -> None:
        """A message from a dead incarnation is dropped; a batch among them is counted in ``dropped_batches`` once."""
        try:
            header, _ = unpack_message(frames, kinds=P.TO_COLLECTOR)
        except ProtocolError:
            return
        if handle.batches.on_late(generation, header):
            self.counters.dropped_batches += 1
            logger.info(
                "dropped batch %s of worker %d's previous process: it arrived after its death",
                header.get("seq"),
                handle.index,
            )

    def _reject(self, identity: bytes, reason: BaseException) -> None:
        self.counters.rejected_messages += 1
        logger.warning(
            "rejected a message from %r (%d so far): %s", identity[:64], self.counters.rejected_messages, reason
        )

    async def _loop(self) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        while True:
            try:
                identity, frames = await endpoint.recv(timeout=1.0)
            except TimeoutError:
                continue
            except TransportError as exc:
                self.events.fail(exc)
                return
            sender = self._sender(identity)
            if sender is not None and (sender[1] < sender[0].generation or sender[0].lost):
                self._on_late(sender[0], sender[1], frames)  # from an incarnation that died (or a worker lost)
                continue
            # Only a live worker's own sockets can break the pool; anything else that reaches the endpoint
            # (a stray or hostile peer, a replay) is dropped, logged and counted, and collection goes on.
            live = sender is not None and sender[1] == sender[0].generation
            try:
                header, td = unpack_message(frames, kinds=P.TO_COLLECTOR)
                if header["kind"] == P.JOIN:  # a worker started by hand, from a socket of its own
                    await self._on_join(identity, header)
                    continue
                if sender is None or not live:
                    raise P.Rejected(f"{header['kind']!r} message from {identity!r:.60}, which is no live worker")
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
            except P.Rejected as exc:
                self._reject(identity, exc)
            except ProtocolError as exc:
                if live:
                    self.events.fail(exc)
                else:
                    self._reject(identity, exc)
            except (TransportError, WorkerError, TimeoutError) as exc:
                self.events.fail(exc)
            self.events.notify()

    async def _dispatch(self, handle: WorkerHandle, header: dict[str, Any], td: TensorDictBase | None) -> None:
        kind = header["kind"]
        if kind == P.BATCH and self._batch_data is not None:  # before anything else: its tensors are on their way
            td = await self._batch_data(handle, header, td)
        now = time.monotonic()
        handle.heartbeats.on_message(now)
        if kind in (P.HEARTBEAT, P.BATCH):
            # Both carry the worker's count: a batch whose frames show a restart comes with it counted.
            restarted = handle.heartbeats.on_env_restarts(header.get("env_restarts", 0))
            alone = handle.heartbeats.on_sub_env_restarts(header.get("sub_env_restarts", []))
            if alone:
                counts = self.counters.sub_env_restarts.setdefault(handle.index, {})
                for sub_env, n in alone.items():
                    counts[sub_env] = counts.get(sub_env, 0) + n
            if restarted:
                self.counters.env_restarts += restarted
                logger.warning(
                    "worker %d rebuilt its env after it raised (env_errors='restart'; the worker logged the "
                    "exception): %d env restarts in all",
                    handle.index,
                    self.counters.env_restarts,
                )
        if kind == P.HEARTBEAT:
            # Frames the worker stepped and gave up (a batch a pause held, then a reseed or restore).
            self.counters.discarded_frames += handle.on_beat(header, now)
        elif kind == P.BATCH:
            lockstep = self.settings.lockstep
            item = handle.on_batch(header, td, lockstep=lockstep)
            if not lockstep:
                self.ready_queue.append(item)
        elif kind == P.HELLO:
            await self._on_hello(handle, header)
        elif kind == P.ACK:
            refused = self.weights.on_ack(handle, header)
            if refused is not None:  # it keeps its weights (see WeightPusher.push)
                logger.warning("worker %d refused weights version %s: %s", handle.index, *refused)
        elif kind == P.ERROR:
            raise RemoteError(
                f"worker {handle.index} ({handle.where}) raised {header.get('type')}: {header.get('message')}",
                worker_id=handle.index,
                type_name=str(header.get("type")),
                remote_traceback=str(header.get("traceback")),
            )
