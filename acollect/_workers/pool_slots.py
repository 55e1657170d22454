"""Where a pool's workers write their batches: a ring of shared-memory slots each, or shared lockstep segments.

:class:`PoolSlots`, one of the :class:`~acollect._workers.pool.WorkerPool`'s parts, decides it (at once without
``shared_batches``; else once every worker said hello, when the layout of each one's part is known), gives each
worker its ring (:class:`~acollect._batches.slot_ring.ShmSlotRing`, or its rows of the
:class:`~acollect._batches.shared_batches.SharedBatches`), tells it where its slots are (at its hello, and again
after a restart), and grows them when the caller holds every one (a batch lent and not dropped yet). A worker
whose batches do not go through shared memory (another host, a small batch, ``use_shared_memory=False``) gets
no ring, and sends its batches in its messages.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from acollect._batches.shared_batches import SharedBatches
from acollect._batches.slot_ring import ShmSlotRing
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle
from acollect._workers.pool_settings import PoolSettings
from acollect.errors import ProtocolError, TransportError

__all__ = ["PoolSlots"]

logger = logging.getLogger("acollect")

#: The pool's ``send``: one command to one worker.
Send = Callable[[WorkerHandle, str, Mapping[str, Any] | None, TensorDictBase | None], Awaitable[None]]


class _Slots(enum.Enum):
    """Where the workers' batches go: decided at once without ``shared_batches``, else once every worker said
    hello (a worker greeted before then gets its slots from ``start()``)."""

    UNDECIDED = "undecided"  # shared_batches: not every worker said hello yet
    SHARED = "shared"  # one segment per lockstep batch in flight, each worker its rows
    PER_WORKER = "per worker"  # each worker a ring of its own (where its batches go through shared memory at all)


class PoolSlots:
    """The shared memory a pool's workers write their batches into.

    Args:
        handles: the pool's handles, one per worker.
        settings: the pool's settings (``shared_batches``, ``slots``, ``ring_slots``).
        send: the pool's ``send``.
        wants_shm: whether a batch of that many bytes goes through shared memory (the pool's rule).
    """

    def __init__(
        self, handles: Sequence[WorkerHandle], settings: PoolSettings, send: Send, wants_shm: Callable[[int], bool]
    ) -> None:
        self._handles = handles
        self._settings = settings
        self._send = send
        self._wants_shm = wants_shm
        self._shared: SharedBatches | None = None
        self._state = _Slots.PER_WORKER if settings.shared_batches is None else _Slots.UNDECIDED

    @property
    def shared(self) -> SharedBatches | None:
        """The segments lockstep batches are written into in place, once every worker said hello (else ``None``)."""
        return self._shared

    def _maps_shm(self, handle: WorkerHandle) -> bool:
        # A remote worker cannot map this host's memory.
        return not handle.config.remote and self._wants_shm(handle.hello.batch_nbytes)

    async def lay_out(self) -> None:
        """Once every worker said hello: one segment per batch in flight, if every part can be written in place."""
        self._state = _Slots.PER_WORKER
        if all(self._maps_shm(h) for h in self._handles):
            layouts = [h.hello.layout for h in self._handles if h.hello.layout is not None]
            stack = self._settings.shared_batches == "stack"
            self._shared = SharedBatches.create(layouts, stack=stack, n_slots=self._settings.slots or 1)
            self._state = _Slots.SHARED
        shared = self._shared
        # Every ring is in place before the first message goes: a worker restarted meanwhile is greeted with it.
        for handle in self._handles:
            if shared is not None:
                handle.memory.use_ring(shared.part_ring(handle.index))
            elif self._maps_shm(handle):
                handle.memory.use_ring(ShmSlotRing.create(handle.hello.layout or {}, self._settings.ring_slots))
        for handle in self._handles:
            await self._send_slots(handle)

    async def on_hello(self, handle: WorkerHandle) -> None:
        """A worker said hello (its layout is known): its ring, and where its slots are, once they are decided."""
        assert handle.hello.layout is not None
        if self._shared is not None:
            if not self._shared.fits(handle.index, handle.hello.layout):
                raise ProtocolError(
                    f"worker {handle.index} came back with another batch layout than its predecessor's: its "
                    "batches no longer fit the rows it writes"
                )
            handle.memory.use_ring(self._shared.part_ring(handle.index))
        elif self._maps_shm(handle) and self._state is _Slots.PER_WORKER:
            handle.memory.use_ring(ShmSlotRing.create(handle.hello.layout, self._settings.ring_slots))
        await self._send_slots(handle)  # shared batches not laid out yet: lay_out() sends them

    async def grow_ring(self, handle: WorkerHandle, count: int) -> bool:
        """``count`` more slots for a worker whose slots are lent to the caller; ``False`` where none could be had
        (no ring, a worker not ready, ``/dev/shm`` full)."""
        ring = handle.memory.ring
        if ring is None or not handle.ready or self._shared is not None:
            return False
        try:
            names = ring.grow(count)
        except TransportError as exc:
            logger.debug(
                "no more shared memory for worker %d's slots (%s): its batch is handed out as a copy", handle.index, exc
            )
            return False
        await self._send(handle, P.SLOTS, {"names": names, "layout": ring.layout, "add": True}, None)
        return True

    async def grow_shared(self, count: int) -> bool:
        """``count`` more lockstep segments (each worker told of its rows of them); ``False`` where none could be
        had."""
        shared = self._shared
        if shared is None:
            return False
        try:
            names = shared.grow(count)
        except TransportError as exc:
            logger.debug("no more shared memory for lockstep batches (%s): this one is handed out as a copy", exc)
            return False
        # The workers' part rings are views of the collector's: new views carry the new segments.
        for handle in self._handles:
            handle.memory.use_ring(shared.part_ring(handle.index))
            if handle.ready:
                message = shared.slots_message(handle.index)
                await self._send(handle, P.SLOTS, {**message, "names": names, "add": True}, None)
        return True

    async def _send_slots(self, handle: WorkerHandle) -> None:
        if handle.memory.ring is None:
            return
        if self._shared is not None:
            await self._send(handle, P.SLOTS, self._shared.slots_message(handle.index), None)
        else:
            await self._send(handle, P.SLOTS, {"names": handle.memory.ring.names, "layout": handle.hello.layout}, None)

    def close(self) -> None:
        """Unlinks the shared segments (the workers' own rings are their handles' to release)."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None
