"""The pool's receive loop: every message off the endpoint is checked and filed.

:class:`Receiver` is given the endpoint, the worker handles and what it reports to
(the pool's :class:`~acollect.pool.events.PoolEvents` and
:class:`~acollect.pool.events.Counters`). Batches go to per-worker inboxes (lockstep
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

from acollect.errors import ProtocolError, RemoteError, TransportError, WorkerError
from acollect.pool.events import Counters, PoolEvents
from acollect.pool.handles import Received, Rejected, WorkerHandle, parse_identity
from acollect.transport.endpoint import Endpoint
from acollect.transport.wire import PROTOCOL_VERSION, pack_message, unpack_message
from acollect.weights import decode_structure
from acollect.worker import protocol as P

__all__ = ["Receiver"]

logger = logging.getLogger("acollect")

#: How a batch's tensors are had: from its message (``td``), or by another road (see acollect.pool.distributed).
BatchData = Callable[[WorkerHandle, dict[str, Any], "TensorDictBase | None"], Awaitable["TensorDictBase | None"]]


class Receiver:
    """The pool's receive loop (:meth:`run`): reads the endpoint, files what comes, reports what goes wrong.

    Args:
        endpoint: the pool's endpoint.
        handles: the pool's workers, by index.
        events: where a failure goes and every change is told.
        counters: where dropped batches, discarded frames and rejected messages are counted.
        ready_queue: where batches go first ready, first served (``credits`` set); else each worker's inbox.
        credits: see :class:`~acollect.pool.pool.WorkerPool`.
        heartbeat_timeout: told to a worker started by hand, with its config.
        greet: answers a worker's hello (slots, weights, the orders, its outstanding request), once its
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
        *,
        credits: int | None,
        heartbeat_timeout: float,
        greet: Callable[[WorkerHandle], Awaitable[None]],
        batch_data: BatchData | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.handles = handles
        self.events = events
        self.counters = counters
        self.ready_queue = ready_queue
        self.credits = credits
        self.heartbeat_timeout = heartbeat_timeout
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
        from acollect.worker.config_codec import encode_config

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
                heartbeat_timeout=self.heartbeat_timeout,
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
        handle.batch_nbytes = sum(int(leaf["nbytes"]) for leaf in header["layout"]["leaves"])
        await self._greet(handle)
        handle.last_beat = handle.last_progress = time.monotonic()
        handle.ready = True

    def _sender(self, identity: bytes) -> tuple[WorkerHandle, int] | None:
        """The worker and generation an identity names (``None``: no worker of this pool)."""
        parsed = parse_identity(identity)
        if parsed is None or parsed[0] >= len(self.handles):
            return None
        return self.handles[parsed[0]], parsed[1]

    def _on_late(self, handle: WorkerHandle, generation: int, frames: list[Any]) -> None:
        """A message from a dead incarnation is dropped; a batch among them is counted in ``dropped_batches`` once."""
        retired = handle.retired
        if retired is None or retired.generation != generation:
            return  # lockstep (counted with its request), or an older incarnation
        try:
            header, _ = unpack_message(frames, kinds=P.TO_COLLECTOR)
        except ProtocolError:
            return
        seq = header.get("seq")
        if header["kind"] != P.BATCH or type(seq) is not int or seq < retired.next_seq:
            return  # not a batch, or one received or counted already (a replay)
        retired.next_seq = seq + 1
        if seq != retired.counted_seq:
            self.counters.dropped_batches += 1
            logger.info("dropped batch %d of worker %d's previous process: it arrived after its death", seq,
                        handle.index)  # fmt: skip

    def _reject(self, identity: bytes, reason: BaseException) -> None:
        self.counters.rejected_messages += 1
        logger.warning("rejected a message from %r (%d so far): %s", identity[:64], self.counters.rejected_messages,
                       reason)  # fmt: skip

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
            if sender is not None and sender[1] < sender[0].generation:
                self._on_late(sender[0], sender[1], frames)  # from an incarnation that died
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
                    raise Rejected(f"{header['kind']!r} message from {identity!r:.60}, which is no live worker")
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
            except Rejected as exc:
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
        handle.last_beat = now
        if kind == P.HEARTBEAT:
            steps, busy = int(header["steps"]), bool(header["busy"])
            handle.sent = int(header.get("sent", 0))
            if steps != handle.last_steps or (busy and not handle.busy):
                handle.last_steps, handle.last_progress = steps, now
            handle.busy = busy
            handle.partial = bool(header.get("partial", busy))
            # Frames the worker stepped and gave up (a batch a pause held, then a reseed or restore).
            discarded = int(header.get("discarded", 0))
            if discarded > handle.discarded_frames:
                self.counters.discarded_frames += discarded - handle.discarded_frames
                handle.discarded_frames = discarded
            # Batches travel on another connection than heartbeats, so one may be overtaken; a batch
            # still missing a heartbeat_timeout later was lost (a dropped connection loses what it held).
            if handle.sent <= handle.next_seq:
                handle.missing_since = None
            elif handle.missing_since is None:
                handle.missing_since = now
        elif kind == P.BATCH:
            seq = header.get("seq")
            if type(seq) is not int:
                raise ProtocolError(f"worker {handle.index} sent a batch with seq={seq!r:.20}, expected an int")
            if seq < handle.next_seq:
                raise Rejected(f"replayed batch: seq {seq} from worker {handle.index}, expected {handle.next_seq}")
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
            item = Received(handle.index, handle.generation, header, data, slot is not None, handle.batch_nbytes)
            if self.credits is None:
                if not handle.requests:
                    raise ProtocolError(f"worker {handle.index} sent a batch nobody asked for")
                item.request = handle.requests.popleft()
                number = header.get("n", item.request.number)
                if number != item.request.number:
                    raise ProtocolError(
                        f"worker {handle.index} answered collect n={number!r:.20}, asked for n={item.request.number}"
                    )
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
