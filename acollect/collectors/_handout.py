"""How a worker collector's batches leave it, and how their memory goes back to the workers.

:class:`HandOut` is one of a worker collector's parts, behind a small interface: :meth:`HandOut.hand_out` makes the
batch of the items the dispatch strategy took (lent: the workers' shared memory itself, given back once the caller
drops it; copied: into memory of a batch the caller dropped, see :class:`HandOutBuffers`; or copied to a GPU
``storing_device`` by DMA), :meth:`HandOut.take_back` gives back at each batch boundary what came back since, and
:meth:`HandOut.give_back` returns a batch never handed out. :class:`LendingBooks` keeps the books of what is lent
and the budget (``max_lent_bytes``); the dispatch strategy (:mod:`acollect.collectors.dispatch`) says which memory
a batch is and how its worker gets it back.

Memory for the batches a collector copies out and hands over: reused once the caller has dropped one.

A batch copied out of shared memory into freshly allocated memory costs more than the copy
itself: the kernel maps the new pages one at a time, as they are first written (a 28 MiB
pixel batch copies about six times slower into new memory than into memory written before).
:class:`HandOutBuffers` remembers the last few large batches it handed out, by their storages
only, and once the caller holds no tensor of one anymore (each storage is referenced from here
alone) it offers that memory again, already mapped, wrapped in new tensors. A batch the caller
still holds, or any tensor of it, or a view of one, is never written: the caller owns what it
was given for as long as it keeps it.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> buffers = HandOutBuffers(min_bytes=0)
    >>> batch = TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    >>> buffers.adopt(batch, key="w0")
    >>> buffers.take("w0") is None  # the caller still holds it
    True
    >>> del batch
    >>> buffers.take("w0")["x"].shape
    torch.Size([4])
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, cast

import anyio
import torch
from tensordict import TensorDictBase

from acollect.devices import move_to
from acollect.pool import Received, WorkerPool
from acollect.transport.cuda_dma import Copy, DeviceCopier
from acollect.transport.lending import Lender
from acollect.transport.shm import SHM_DIR
from acollect.worker import protocol as P

if TYPE_CHECKING:
    from acollect.collectors.dispatch import Dispatch

__all__ = ["DEFAULT_LENT_BYTES", "INLINE_HAND_OUT_BYTES", "HandOut", "HandOutBuffers", "LendingBooks", "default_budget"]

#: The most shared memory lent at once, by default: beyond it batches are copies (see default_budget).
DEFAULT_LENT_BYTES = 1 << 30
#: Batches of at most this many bytes are combined and handed out on the event loop (well under a
#: millisecond of copying), larger ones in a thread.
INLINE_HAND_OUT_BYTES = 1 << 20

# How many tensors reference a storage (views included). Private torch API: without it (another torch)
# nothing is ever reused, and every batch is fresh memory as before.
_use_count: Any = getattr(torch._C, "_storage_Use_Count", None)


def _alias(td: TensorDictBase) -> TensorDictBase:
    # New tensor objects over the same memory: whatever the caller does to the metadata of the tensors it
    # was given (an in-place unsqueeze_, requires_grad_) never reaches the ones kept here, and the other way.
    return td.detach()


def _leaves(td: TensorDictBase) -> list[torch.Tensor]:
    return [t for t in td.values(include_nested=True, leaves_only=True) if isinstance(t, torch.Tensor)]


class _Entry:
    __slots__ = ("base", "key", "storages")

    def __init__(self, key: Hashable, base: TensorDictBase, storages: list[Any]) -> None:
        self.key = key
        self.base = base  # private aliases of the batch handed out
        self.storages = storages  # one per leaf: referenced here by ``base`` and by this list

    def free(self) -> bool:
        # 2: the alias in ``base`` and the storage object in ``storages``; anything more is the caller's.
        return all(_use_count(s._cdata) == 2 for s in self.storages)


class HandOutBuffers:
    """The memory of the last ``keep`` batches handed out (of ``min_bytes`` or more), for reuse once dropped.

    Not thread-safe: one caller at a time (a collector combines one batch at a time).

    Args:
        keep: how many dropped batches may be kept mapped for reuse (their memory stays allocated
            until the collector shuts down, or a newer batch takes their place).
        min_bytes: smaller batches are left alone: fresh memory of that size is mapped already.
    """

    def __init__(self, keep: int = 3, min_bytes: int = 1 << 20) -> None:
        self.keep = keep
        self.min_bytes = min_bytes
        self._entries: list[_Entry] = []

    def take(self, key: Hashable) -> TensorDictBase | None:
        """A batch of new tensors over the memory of a batch the caller dropped, made for ``key``; else ``None``.

        ``key`` names the layout of what will be copied in (say, which workers' batches, and their
        incarnations): memory made for another key is never offered.
        """
        for i, entry in enumerate(self._entries):
            if entry.key == key and entry.free():
                self._entries.append(self._entries.pop(i))  # the most recently handed out last
                return _alias(entry.base)
        return None

    def adopt(self, batch: TensorDictBase, key: Hashable) -> None:
        """Remembers the memory of ``batch`` (about to be handed out, made for ``key``) for reuse once dropped."""
        if _use_count is None:
            return
        leaves = _leaves(batch)
        if sum(t.numel() * t.element_size() for t in leaves) < self.min_bytes:
            return
        if any(t.device.type != "cpu" or not t.is_contiguous() or t.storage_offset() for t in leaves):
            return
        storages = [t.untyped_storage() for t in leaves]
        if len({s.data_ptr() for s in storages}) != len(storages):
            return  # leaves sharing a storage: their use counts would say nothing about the caller
        self._entries = [e for e in self._entries if e.key == key]  # another layout's memory is of no use now
        if len(self._entries) >= self.keep:
            self._entries.pop(0)  # still held by the caller (else it was taken): its memory is the caller's
        self._entries.append(_Entry(key, _alias(batch), storages))

    def forget(self, batch: TensorDictBase) -> None:
        """Stops tracking ``batch``'s memory (it was taken but not handed out, e.g. the copy into it failed)."""
        ptrs = {t.untyped_storage().data_ptr() for t in _leaves(batch)}
        self._entries = [e for e in self._entries if not ptrs & {s.data_ptr() for s in e.storages}]

    def clear(self) -> None:
        """Forgets every batch (their memory goes once the caller drops them)."""
        self._entries = []

    def __len__(self) -> int:
        return len(self._entries)


def default_budget() -> int:
    """:data:`DEFAULT_LENT_BYTES`, or a quarter of ``/dev/shm`` where that is less (a container's is often small)."""
    try:
        total = shutil.disk_usage(SHM_DIR).total
    except OSError:
        return DEFAULT_LENT_BYTES
    return max(1, min(DEFAULT_LENT_BYTES, total // 4))


class LendingBooks:
    """The books of a collector's lent batches: how many each memory owner has out, and the budget.

    Examples:
        >>> from tensordict import TensorDict
        >>> books = LendingBooks(budget=1 << 20)
        >>> batch = books.lend(TensorDict({"x": torch.zeros(8)}, batch_size=[8]), key=("w", 0), token=3)
        >>> books.held(("w", 0)), books.lent_bytes
        (1, 32)
        >>> del batch
        >>> books.returned()
        [(('w', 0), 3)]
        >>> books.held(("w", 0))
        0

    Args:
        budget: the most bytes lent at once (beyond it the collector hands out copies).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.lender = Lender()
        self._held: Counter[Hashable] = Counter()
        #: batches handed out as copies because lending them would have passed the budget
        self.over_budget = 0
        #: batches lent so far
        self.lent_batches = 0

    @property
    def lent_bytes(self) -> int:
        """Shared memory lent now (bytes)."""
        return self.lender.lent_bytes

    @property
    def outstanding(self) -> int:
        """Batches lent and not given back yet."""
        return self.lender.outstanding

    def room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be lent; counts a refusal (the batch is then a copy)."""
        if self.lender.lent_bytes + nbytes <= self.budget:
            return True
        self.over_budget += 1
        return False

    def held(self, key: Hashable) -> int:
        """Batches out from the memory owner ``key`` (a worker's incarnation, or the lockstep segments)."""
        return self._held[key]

    def lend(self, td: TensorDictBase, *, key: Hashable, token: Hashable) -> TensorDictBase:
        """``td`` lent (new tensors over its memory); ``(key, token)`` comes back from :meth:`returned` once dropped."""
        self._held[key] += 1
        self.lent_batches += 1
        return self.lender.lend(td, (key, token))

    def returned(self) -> list[tuple[Hashable, Hashable]]:
        """``(key, token)`` of every lent batch given back since the last call."""
        back: list[tuple[Hashable, Hashable]] = []
        for returned in self.lender.returned():
            key, token = cast(tuple[Hashable, Hashable], returned)  # what lend() queued: the lender keeps any token
            self._held[key] -= 1
            back.append((key, token))
        return back


class HandOut:
    """How a worker collector's batches leave it (see the module's notes): lent, copied, or copied to a GPU.

    Args:
        dispatch: the collector's dispatch strategy (which memory a batch is, how its worker gets it back).
        copy_batches: the ``copy_batches`` option (``True``: never lend).
        budget: the most bytes lent at once (``max_lent_bytes``).
        storing_device: where batches are stored (``None``: where the workers made them).
    """

    def __init__(
        self, dispatch: Dispatch, *, copy_batches: bool, budget: int, storing_device: torch.device | None
    ) -> None:
        self._dispatch = dispatch
        self._copy_batches = copy_batches
        self._storing = storing_device
        self.books = LendingBooks(budget)
        # storing_device on a GPU: batches go there by DMA from the workers' shared memory (transport.cuda_dma).
        self._copier: DeviceCopier | None = None
        self._copies: list[Copy] = []  # copies whose source memory is read until they finished
        self._held: list[Received] = []  # items whose memory a copy to a GPU reads: given back at the next batch

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        """At set-up: the copier of a GPU ``storing_device``."""
        self._held, self._copies = [], []
        if self._storing is not None and self._storing.type == "cuda":
            self._copier = DeviceCopier(self._storing)

    def close(self) -> None:
        """Before the pool unmaps its segments: waits for the copies in flight and unregisters the memory."""
        copier, self._copier = self._copier, None
        self._copies = []
        if copier is not None:
            copier.close()

    # -- what it says ------------------------------------------------------------------------
    @property
    def lent(self) -> dict[str, int]:
        """What the caller holds of the workers' shared memory (see ``MultiCollectorBase.lent``)."""
        books = self.books
        return {"batches": books.outstanding, "bytes": books.lent_bytes, "budget": books.budget,
                "lent_so_far": books.lent_batches, "copies_over_budget": books.over_budget}  # fmt: skip

    @property
    def pinned_bytes(self) -> int:
        """Bytes of shared memory registered with CUDA for copies to the GPU ``storing_device`` (0 otherwise)."""
        return self._copier.registered_bytes if self._copier is not None else 0

    # -- per batch ---------------------------------------------------------------------------
    async def hand_out(
        self, pool: WorkerPool, items: list[Received], reshape: Callable[[TensorDictBase], TensorDictBase] | None
    ) -> TensorDictBase:
        """The batch of ``items``, lent, copied or on the GPU, ``reshape`` (postproc, ``split_trajs``) applied off
        the event loop; each item's memory is then given back to its worker, at once or once no longer read."""
        copier = self._copier
        books: LendingBooks | None = None
        if copier is None and not self._copy_batches and await self._dispatch.can_lend(pool, items, self.books):
            books = self.books
        try:
            if copier is not None:
                # Read where it lies, held until its copy ended (take_back): no CPU copy on the way.
                copy = copier.copy(self._dispatch.view(items))
                self._copies.append(copy)
                batch = copier.hand_over(copy)
                if reshape is not None:
                    batch = await anyio.to_thread.run_sync(reshape, batch)
            elif self._inline(items, lent=books is not None, reshapes=reshape is not None):
                batch = self._combine(items, books, reshape)
            else:
                # Off the event loop: combining (and postproc of) pixel batches takes milliseconds.
                batch = await anyio.to_thread.run_sync(self._combine, items, books, reshape)
        finally:
            for item in items:
                if books is not None:
                    await self._dispatch.lent(pool, item)
                elif copier is not None:
                    self._held.append(item)
                else:
                    await self.give_back(pool, item)
        return batch

    def _inline(self, items: list[Received], *, lent: bool, reshapes: bool) -> bool:
        # A small batch is combined on the event loop: its copy costs less than the hop to a thread (and the
        # trainer's CPU per batch is what the workers lose on a machine with few cores); a lent one costs no copy.
        # User code (postproc) and moves to another device stay in the thread.
        storing = self._storing
        return (
            not reshapes
            and (storing is None or storing.type == "cpu")
            and (lent or sum(item.nbytes for item in items) <= INLINE_HAND_OUT_BYTES)
        )

    def _combine(
        self,
        items: list[Received],
        books: LendingBooks | None,
        reshape: Callable[[TensorDictBase], TensorDictBase] | None,
    ) -> TensorDictBase:
        batch = self._dispatch.combine(items, books=books)
        device = self._storing
        if device is not None and device.type != "cpu" and batch.device != device:
            batch = move_to(batch, device)
        return reshape(batch) if reshape is not None else batch

    async def give_back(self, pool: WorkerPool, item: Received) -> None:
        """Gives ``item``'s memory back to its worker (with a credit where it collects on credits)."""
        if self._dispatch.give_back(item):  # a part of a shared segment: the collector's to free, not the worker's
            return
        handle = pool.handles[item.worker]
        slot = item.header.get("slot")
        # A lockstep worker collects only when asked: a credit means something to it only as a slot to free.
        if item.generation == handle.generation and (slot is not None or pool.credits is not None):
            await pool.send(handle, P.CREDIT, {"slot": slot})

    async def take_back(self, pool: WorkerPool) -> None:
        """Gives back what the caller dropped since the last batch, and what a finished copy to a GPU held."""
        for key, token in self.books.returned():
            await self._dispatch.returned(pool, key, token)
        copies, self._copies = self._copies, []
        if copies and self._copier is not None:
            for copy in copies:  # long done, most of the time: a trainer used the batch since
                self._copier.copied(copy)
        held, self._held = self._held, []
        for item in held:
            await self.give_back(pool, item)
