"""How a multi-process collector takes its batches from the workers: in lockstep, or first ready.

Every multi-process collector (:class:`~acollect.MultiSyncCollector`, :class:`~acollect.MultiAsyncCollector`,
:class:`~acollect.DistributedCollector`, :class:`~acollect.RayCollector`...) runs the same worker pool and
holds one of two *dispatch strategies*, which is all that differs between "sync" and "async":

* :class:`Lockstep` (``sync=True``): each worker collects ``frames_per_batch / n_workers`` frames per
  batch (the next one begun as soon as this one is taken, while nothing changes the workers between
  batches); a batch combines one part from every worker (stacked or concatenated), every live worker's
  where a worker was lost (``on_worker_loss="continue"``).
* :class:`FirstReady` (``sync=False``): each worker collects ``frames_per_batch`` frames ahead of the
  trainer, up to ``credits`` batches; a batch is the first worker batch ready, tagged with its worker.

A strategy knows the pool, never the collector: the collector asks it how many frames a worker collects
and how many credits it holds (when building workers), to start the workers (at set-up), to take and
combine the next batch, and to pause or resume the workers. Every multi-process collector gets its strategy
from :func:`dispatch_for`, which reads its settings (:mod:`acollect.collectors._collector_settings`): the
mode its class fixes, or the ``sync`` option of a collector that takes one (the one place it is read).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import ClassVar

import anyio
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._batches.handout_buffers import HandOutBuffers
from acollect._batches.lending import Loans
from acollect._batches.shared_batches import SharedBatches
from acollect._workers import protocol as P
from acollect._workers.handles import CollectRequest, Received, WorkerHandle
from acollect._workers.pool import WorkerPool
from acollect.collectors._collector_settings import ModeSettings, MultiAsyncSettings, MultiSyncSettings
from acollect.errors import ConfigurationError

__all__ = ["Dispatch", "FirstReady", "Lockstep", "dispatch_for"]

#: the lending key of the lockstep segments every worker writes (their memory is the collector's)
_SHARED = "shared"


@asynccontextmanager
async def _held(lock: anyio.Lock) -> AsyncIterator[None]:
    """``lock`` held, taken without a trip through the event loop where it is free.

    A free ``anyio.Lock`` still yields to the loop when taken. Beside a trainer that computes between its awaits,
    every trip is a whole trainer step: the ask for a worker's next part reached it a step later, and a worker done
    with its part idled meanwhile (docs/background.md, "Cores for the trainer"). A held lock is waited for as ever.
    """
    try:
        lock.acquire_nowait()
    except anyio.WouldBlock:
        await lock.acquire()
    try:
        yield
    finally:
        lock.release()


class Dispatch:
    """What a multi-process collector does differently in lockstep and first-ready collection."""

    #: ``True``: lockstep batches from every worker; ``False``: first ready, first served.
    sync: ClassVar[bool]
    #: Batches each worker may collect ahead (``None``: one batch per ``collect`` request).
    credits: int | None
    #: Shared-memory slots per worker, where batches go through them (``None``: one per credit).
    slots: int | None = None
    #: ``"stack"`` or ``"cat"``: every batch one shared segment the workers write their rows of (see
    #: :class:`~acollect._batches.shared_batches.SharedBatches`); ``None``: a ring of slots per worker.
    shared_batches: str | None = None

    async def start(self, pool: WorkerPool, *, paused: bool) -> None:
        """Sets the freshly started workers going (``paused``: a pause is held already)."""

    async def take(self, pool: WorkerPool, *, ahead: bool = False) -> list[Received]:
        """Waits for, and removes from the pool, the worker batches the next batch is made of.

        ``ahead``: the caller will want a batch after this one, so workers may begin it now.
        """
        raise NotImplementedError

    def combine(self, items: list[Received], *, loans: Loans | None = None) -> TensorDictBase:
        """Makes the batch handed out from ``items``: their shared memory lent through ``loans`` (where
        :meth:`can_lend` said so), else a copy (in a thread: copying large batches takes milliseconds)."""
        raise NotImplementedError

    def view(self, items: list[Received]) -> TensorDictBase:
        """The batch of ``items`` as views of the memory it lies in, without a copy where it is one piece (read at
        once, before the memory is given back: a copy to a GPU)."""
        return self.combine(items)

    async def can_lend(self, pool: WorkerPool, items: list[Received], loans: Loans) -> bool:
        """Whether the batch of ``items`` can be lent (it is one piece of shared memory, the budget has room) and its
        workers can go on collecting meanwhile (getting more slots if they need them)."""
        return False

    async def lent(self, pool: WorkerPool, item: Received) -> None:
        """``item``'s memory was lent: what its worker is told now (the memory itself comes back later)."""

    async def returned(self, pool: WorkerPool, key: Hashable, token: Hashable) -> None:
        """The caller dropped the last tensor of a lent batch: its memory is given back (see
        :meth:`~acollect._batches.lending.Loans.lend`)."""

    def give_back(self, item: Received) -> bool:
        """Frees ``item``'s part of a shared segment, if it was one (``False``: its worker is given the slot back)."""
        return False

    async def credit(self, pool: WorkerPool, handle: WorkerHandle, slot: int | None = None) -> None:
        """Gives ``handle``'s worker a credit (giving back ``slot`` if not ``None``)."""
        await pool.credit(handle, slot)

    async def apply_pause(self, pool: WorkerPool | None, paused: bool) -> None:
        """Tells the workers to stop (``True``) or go on; nothing to do where they only work when asked."""

    def reset(self) -> None:
        """Forgets the memory kept for reuse (at shutdown: what the caller still holds stays the caller's)."""


class Lockstep(Dispatch):
    """Lockstep: one request per batch to every worker, and a batch made of one part from each.

    Workers begin the next batch as soon as this one is taken (so they collect while the trainer uses
    it), unless the caller pushed weights, reseeded or restored state before this batch: a loop that
    pushes weights after every batch gets batches collected on request, each wholly made by the weights
    pushed before it. Every worker's stream of steps stays contiguous, and every frame carries the
    version that chose it:

    * weights pushed while a batch is collected ahead apply from the batch after it (that batch, made
      by the previous version, is handed out as it is: no step is thrown away); a push applies from the
      first batch asked of no worker yet, on every worker, so a batch's parts never differ in version;
    * a pause stops the workers at their next step and they continue the same batch after it;
    * a batch begun ahead before a reseed or a state restore is dropped, its frames counted in
      ``stats().discarded_frames``, and collected anew from the fresh start the caller asked for.

    Run-ahead: when the caller asks for a batch, every worker is asked for its part of the next one too (where
    collect-ahead would ask for that batch anyway), so a worker done with its part goes on at once instead of
    idling until the slowest one's part is in and a request came back. A worker is at most one part ahead of
    the batch the caller waits for. Requests are numbered by batch (``collect``'s ``n``), the same for every
    worker.

    Where batches go through shared memory and the parts stack (or concatenate along envs), they are not
    combined at all: every worker writes its rows of one segment per batch in flight (the pool's
    :class:`~acollect._batches.shared_batches.SharedBatches`), each ``collect`` names the segment, and a segment is free
    again once every part of its batch was given back (a lent batch: at the next iteration).

    Args:
        cat_results: ``None`` or ``"stack"`` stacks worker batches into ``[n_workers, n_envs, T]``; ``0``
            concatenates along envs, ``-1`` along time (the collector's option, checked by its settings).
    """

    sync = True
    #: One slot holds the batch being handed out while the next one is collected into the other.
    slots = 2

    def __init__(self, cat_results: str | int | None) -> None:
        self.cat_results = cat_results
        self._cat_dim = cat_results if isinstance(cat_results, int) else 0  # the dim parts are concatenated along
        self.credits = None
        # Stacked, or concatenated along envs, each worker's rows are contiguous: written in place (time: gathered).
        stack = self.cat_results in (None, "stack")
        self.shared_batches = "stack" if stack else "cat" if self.cat_results == 0 else None
        self._changes_seen = -1  # the pool's boundary messages when the last batch was taken
        self._buffers = HandOutBuffers()  # copy_batches=True: memory of dropped batches, mapped already
        self._shared: SharedBatches | None = None  # the pool's, where batches are written in place
        self._number = 1  # the batch the next take() hands out (batches are numbered from 1, as asked of workers)
        self._segments: dict[int, int] = {}  # batch number -> the shared segment its parts go into, once asked for

    async def start(self, pool: WorkerPool, *, paused: bool) -> None:
        self._shared, self._segments, self._number = pool.slots.shared, {}, pool.batches_asked + 1
        if paused:
            await pool.order_pause(True)

    async def _ask(self, pool: WorkerPool, number: int, *, ahead: bool) -> bool:
        """Asks every worker not asked yet for its part of batch ``number``.

        Returns ``False`` (asking nobody) where no shared segment is free for that batch: one holds the batch being
        collected, the other a batch lent to the caller or not given back yet.
        """
        if (self._shared is None or number in self._segments) and all(
            h.lost or h.lockstep.asked(number) for h in pool.handles
        ):
            return True  # asked of everyone already (take() asks again after each wait): nothing to order
        # Under the weight pusher's order: a push computes the first batch it applies to, and reaches every
        # worker, wholly before or wholly after the requests of this batch go out (see WeightPusher).
        async with _held(pool.weights.order):
            slot = self._segments.get(number)
            if self._shared is not None and slot is None:
                slot = self._shared.acquire()
                if slot is None:
                    return False
                self._segments[number] = slot
            pool.note_asked(number)
            for handle in pool.handles:
                if handle.lost or handle.lockstep.asked(number):
                    continue
                request = CollectRequest(number, slot, ahead)
                handle.lockstep.on_ask(request)
                # A restarted worker that has not said hello yet is not connected: it gets the request with its
                # hello (the pool resends the requests outstanding then).
                if handle.ready:
                    await pool.send(handle, P.COLLECT, request.fields())
        return True

    @staticmethod
    def _stale(handle: WorkerHandle, item: Received) -> bool:
        # Begun ahead, by this incarnation, before a reseed or a state restore it was sent since.
        began_after = item.header.get("resets", handle.commands.resets_sent)
        ahead = item.request is not None and item.request.ahead
        return ahead and item.generation == handle.generation and began_after != handle.commands.resets_sent

    async def take(self, pool: WorkerPool, *, ahead: bool = False) -> list[Received]:
        number = self._number
        handles = pool.handles
        while True:
            if not await self._ask(pool, number, ahead=False):
                raise RuntimeError("no free shared batch segment: a batch was never given back")
            # Run-ahead: every worker has its part of the next batch asked for while it collects this one, so it
            # goes on at once, where it would otherwise idle until the last part is in and a request came back.
            # Only where collect-ahead would ask for that batch anyway (the caller will want it, no change since
            # the last batch was taken, no pause): it changes when a part begins, never which weights make it.
            if ahead and pool.changes_sent == self._changes_seen and not pool.mode.paused:
                await self._ask(pool, number + 1, ahead=True)  # no segment free: asked for at the end, or when taken
            # A worker lost meanwhile (on_worker_loss="continue") is left out: the batch holds the live ones' parts.
            await pool.events.wait_until(
                lambda: all(h.lockstep.part(number) is not None for h in handles if not h.lost),
                what="a batch from every worker",
            )
            stale = False
            for handle in [h for h in handles if not h.lost]:
                part = handle.lockstep.part(number)
                if part is None:  # lost during an await of this loop
                    continue
                if self._stale(handle, part):  # its rows are written again, and the worker asked again
                    stale = True
                    handle.lockstep.take_part(number)
                    pool.discard(part.data.numel())
                    if part.header.get("slot") is not None and self._shared is None:
                        await pool.credit(handle, part.header["slot"])
            if not stale:
                break
        items = [handle.lockstep.take_part(number) for handle in handles if not handle.lost]
        segment = self._segments.pop(number, None)
        if segment is not None:
            assert self._shared is not None
            self._shared.check_one_slot({item.worker: item.header.get("slot") for item in items}, segment)
            self._shared.expect(segment, len(items))
        self._number = number + 1
        # Ahead only after a batch that no change preceded: where the caller pushes weights before every
        # batch, every batch begun ahead would be made by the weights before the push.
        calm = pool.changes_sent == self._changes_seen
        self._changes_seen = pool.changes_sent
        if ahead and calm and not pool.mode.paused:
            await self._ask(pool, number + 1, ahead=True)  # no segment free: asked for when taken
        return items

    def _into(self, parts: list[TensorDictBase], out: TensorDictBase) -> TensorDictBase:
        if self.cat_results in (None, "stack"):
            return TensorDict.stack(parts, 0, out=out)
        return TensorDict.cat(parts, self._cat_dim, out=out)

    def _in_place(self, items: list[Received]) -> TensorDictBase | None:
        """The batch ``items`` were written into, whole, where they share one segment (else ``None``)."""
        slot = items[0].header.get("slot")
        if self._shared is None or not items[0].in_slot or type(slot) is not int:
            return None
        if len(items) != len(self._shared.parts):
            return None  # a lost worker's rows lie in the segment too: the live parts are gathered
        return self._shared.batch(slot)

    async def can_lend(self, pool: WorkerPool, items: list[Received], loans: Loans) -> bool:
        if self._in_place(items) is None or self._shared is None:
            return False  # gathered from parts: a copy is made anyway
        if not loans.room_for(sum(item.nbytes for item in items)):
            return False
        # Lent segments, this one, and two more: the next batch's and the one asked for ahead.
        missing = loans.held(_SHARED) + 3 - len(self._shared)
        return missing <= 0 or await pool.slots.grow_shared(missing)

    def view(self, items: list[Received]) -> TensorDictBase:
        whole = self._in_place(items)
        return whole.copy() if whole is not None else self.combine(items)

    def combine(self, items: list[Received], *, loans: Loans | None = None) -> TensorDictBase:
        whole = self._in_place(items)
        if whole is not None:
            if loans is not None:  # the segment itself, given back when the caller drops it
                return loans.lend(whole, key=_SHARED, token=items[0].header["slot"], fixed=True)
            reused = self._buffers.take("shared")  # the memory of a batch the caller dropped: one copy_, no faults
            if reused is not None:
                return reused.copy_(whole)
            batch = whole.clone()
            self._buffers.adopt(batch, "shared")
            return batch
        parts = [item.data for item in items]
        stack = self.cat_results in (None, "stack")
        # Which incarnation of which worker made each part: the layout of what is combined.
        key = tuple((item.worker, item.generation) for item in items)
        reused = self._buffers.take(key)  # the memory of a batch the caller dropped
        if reused is not None:
            try:
                return self._into(parts, reused)
            except (RuntimeError, ValueError, KeyError):
                self._buffers.forget(reused)
        try:
            if stack:
                batch = TensorDict.stack(parts, 0)
            else:
                batch = TensorDict.cat(parts, self._cat_dim)
        except (RuntimeError, ValueError) as exc:
            shapes = [tuple(p.shape) for p in parts]
            raise ConfigurationError.bad_value(
                "cat_results",
                self.cat_results,
                f"a way to combine worker batches of shapes {shapes} (stack needs equal shapes, 0 equal T, "
                f"-1 equal n_envs): {exc}",
            ) from exc
        self._buffers.adopt(batch, key)
        return batch

    async def lent(self, pool: WorkerPool, item: Received) -> None:
        pass  # the segment stays taken until the caller drops the batch; a lockstep worker holds no credits

    async def returned(self, pool: WorkerPool, key: Hashable, token: Hashable) -> None:
        if self._shared is not None and key == _SHARED and isinstance(token, int):
            self._shared.give_back_whole(token)

    async def apply_pause(self, pool: WorkerPool | None, paused: bool) -> None:
        # A worker collecting ahead stops at its next step, keeping the batch.
        if pool is not None:
            await pool.order_pause(paused)

    def give_back(self, item: Received) -> bool:
        if self._shared is None or not item.in_slot or type(item.header.get("slot")) is not int:
            return False
        self._shared.give_back(item.header["slot"])
        return True

    def reset(self) -> None:
        self._buffers.clear()
        self._shared, self._segments = None, {}


class FirstReady(Dispatch):
    """First ready, first served: workers collect ahead of the trainer, and each batch is one worker's.

    Every batch is ``[n_envs, T]``, tagged with ``("collector", "worker_id")``; a slow worker never holds
    the others back.

    Args:
        credits: batches each worker may collect ahead of the trainer (memory stays bounded; the collector's
            option, checked by its settings).
    """

    sync = False

    def __init__(self, credits: int) -> None:
        self.credits: int = credits
        # copy_batches=True: per worker, the memory of batches the caller dropped, mapped already.
        self._buffers: dict[int, HandOutBuffers] = {}
        # Per worker: (its generation, slots of lent batches the caller dropped), told with its next credit.
        self._freed: dict[int, tuple[int, list[int]]] = {}

    async def start(self, pool: WorkerPool, *, paused: bool) -> None:
        await pool.order_run(self.credits)
        if paused:
            await pool.order_pause(True)

    async def take(self, pool: WorkerPool, *, ahead: bool = False) -> list[Received]:
        await pool.events.wait_until(lambda: pool.ready_queue, what="a batch from any worker")
        return [pool.ready_queue.popleft()]

    async def can_lend(self, pool: WorkerPool, items: list[Received], loans: Loans) -> bool:
        (item,) = items
        handle = pool.handles[item.worker]
        if not item.in_slot or item.generation != handle.generation or handle.memory.ring is None:
            return False  # over message frames (the caller's already), or from a worker that died since
        if not loans.room_for(item.nbytes):
            return False
        # Its worker collects on its credits, each into a slot of its ring: slots enough for those and every one lent.
        missing = self.credits + loans.held((item.worker, item.generation)) + 1 - len(handle.memory.ring)
        return missing <= 0 or await pool.slots.grow_ring(handle, missing)

    def view(self, items: list[Received]) -> TensorDictBase:
        (item,) = items
        batch = item.data.copy()  # a new TensorDict over the slot's memory
        batch.set(("collector", "worker_id"), torch.full(batch.shape, item.worker, dtype=torch.int64))
        return batch

    def combine(self, items: list[Received], *, loans: Loans | None = None) -> TensorDictBase:
        (item,) = items
        if not item.in_slot:
            batch = item.data  # over the message's own frames: already the caller's memory
        elif loans is not None:  # the slot itself, given back to its worker when the caller drops the batch
            batch = loans.lend(item.data, key=(item.worker, item.generation), token=item.header["slot"], fixed=True)
        else:
            buffers = self._buffers.setdefault(item.worker, HandOutBuffers())
            reused = buffers.take(item.generation)
            if reused is not None:
                batch = reused.copy_(item.data)
            else:
                batch = item.data.clone()
                buffers.adopt(batch, item.generation)
        batch.set(("collector", "worker_id"), torch.full(batch.shape, item.worker, dtype=torch.int64))
        return batch

    async def lent(self, pool: WorkerPool, item: Received) -> None:
        # The credit now (it collects on); the slot when the loan ends.
        handle = pool.handles[item.worker]
        if item.generation == handle.generation:
            await self.credit(pool, handle)

    async def returned(self, pool: WorkerPool, key: Hashable, token: Hashable) -> None:
        """A lent batch was dropped: its slot goes back with its worker's next credit.

        Not at once: a word less per batch (a ``write()``, or a message for a worker on another host). The worker
        never waits for it. Its ring holds ``credits`` slots besides those lent, counted when each batch is lent
        (:meth:`can_lend`); a dropped batch only turns a lent slot into a freed one, so until its next credit
        (which carries the slots freed) the worker has a slot for each credit it holds.
        """
        assert isinstance(key, tuple)  # what combine() lent with: (worker, generation), and the slot
        assert isinstance(token, int)
        worker, generation = key
        handle = pool.handles[worker]
        if generation != handle.generation or not handle.ready:
            return  # its slots died with it
        held = self._freed.get(worker)
        if held is None or held[0] != generation:
            self._freed[worker] = (generation, [token])
        else:
            held[1].append(token)

    async def credit(self, pool: WorkerPool, handle: WorkerHandle, slot: int | None = None) -> None:
        """A credit to ``handle``'s worker, carrying the slots freed since its last one (one a word)."""
        held = self._freed.pop(handle.index, None)
        slots = held[1] if held is not None and held[0] == handle.generation else []
        if slots and slot is None:
            slot = slots.pop()
        await pool.credit(handle, slot)
        for freed in slots:  # more than one dropped since its last credit: the rest one by one
            await pool.free(handle, freed)

    def reset(self) -> None:
        self._buffers.clear()
        self._freed.clear()

    async def apply_pause(self, pool: WorkerPool | None, paused: bool) -> None:
        # Workers stop at their next step, keeping the batch in progress.
        if pool is not None and pool.mode.running:
            await pool.order_pause(paused)


def dispatch_for(settings: MultiSyncSettings | MultiAsyncSettings) -> Lockstep | FirstReady:
    """The strategy a collector's checked settings ask for, built from its option.

    A collector with a mode (:class:`~acollect.collectors._collector_settings.ModeSettings`) takes
    :class:`Lockstep` with ``sync=True``, else :class:`FirstReady`; any other collector's class fixes its mode.

    Examples:
        >>> from acollect.collectors._collector_settings import ModeSettings
        >>> type(dispatch_for(ModeSettings(frames_per_batch=8, sync=True))).__name__
        'Lockstep'
    """
    if isinstance(settings, ModeSettings):
        return Lockstep(settings.cat_results) if settings.sync else FirstReady(settings.credits)
    if isinstance(settings, MultiSyncSettings):
        return Lockstep(settings.cat_results)
    return FirstReady(settings.credits)
