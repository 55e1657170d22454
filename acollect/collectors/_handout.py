"""How a worker collector's batches leave it, and how their memory goes back to the workers.

:class:`HandOut` is one of a worker collector's parts, behind a small interface: :meth:`HandOut.hand_out` makes the
batch of the items the dispatch strategy took (lent: the workers' shared memory itself, given back once the caller
drops it; copied: into memory of a batch the caller dropped, see
:class:`~acollect._batches.handout_buffers.HandOutBuffers`; or moved to an accelerator ``storing_device``),
:meth:`HandOut.take_back` gives back at each batch boundary what came back since, and
:meth:`HandOut.give_back` returns a batch never handed out.

A batch goes to an accelerator the way PyTorch guarantees: ``.to(device, non_blocking=True)`` from the workers'
memory where it lies, on the consumer's thread (the event loop's) and its current stream, so the consumer's kernels
queue behind the copy by stream order alone. The source is pageable memory, which CUDA has read (into its own staging
buffer) when the call returns, so the workers get their memory back at once. ``cuda_dma=True`` opts into
:class:`~acollect._batches.cuda_dma.DeviceCopier` instead (the pool's pages registered with CUDA, copied by DMA on a
side stream): not yet run on a GPU.
:class:`~acollect._batches.lending.Loans` keeps the record of what is lent and the budget
(``max_lent_bytes``); the dispatch strategy (:mod:`acollect.collectors._dispatch`) says which memory
a batch is and how its worker gets it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import torch
from tensordict import TensorDictBase

from acollect._batches.cuda_dma import Copy, DeviceCopier
from acollect._batches.lending import Loans
from acollect._devices import cuda_ready, move_to, order_after
from acollect._workers.handles import Received
from acollect._workers.pool import WorkerPool

if TYPE_CHECKING:
    from acollect.collectors._dispatch import Dispatch

__all__ = ["INLINE_HAND_OUT_BYTES", "HandOut"]
#: Batches of at most this many bytes are combined and handed out on the event loop (well under a
#: millisecond of copying), larger ones in a thread.
INLINE_HAND_OUT_BYTES = 1 << 20


class HandOut:
    """How a worker collector's batches leave it (see the module's notes): lent, copied, or copied to a GPU.

    Args:
        dispatch: the collector's dispatch strategy (which memory a batch is, how its worker gets it back).
        copy_batches: the ``copy_batches`` option (``True``: never lend).
        budget: the most bytes lent at once (``max_lent_bytes``).
        storing_device: where batches are stored (``None``: where the workers made them).
        cuda_dma: the ``cuda_dma`` option: a CUDA ``storing_device`` is reached by the registering copier.
    """

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        copy_batches: bool,
        budget: int,
        storing_device: torch.device | None,
        cuda_dma: bool = False,
    ) -> None:
        self._dispatch = dispatch
        self._copy_batches = copy_batches
        #: The accelerator batches are moved to (``None``: they stay on the host).
        self._device = storing_device if storing_device is not None and storing_device.type != "cpu" else None
        self._cuda_dma = cuda_dma
        self.loans = Loans(budget)
        # cuda_dma=True: batches go to the GPU by DMA from the workers' registered shared memory (transport.cuda_dma).
        self._copier: DeviceCopier | None = None
        self._copies: list[Copy] = []  # copies whose source memory is read until they finished
        self._held: list[Received] = []  # items whose memory a copy to a GPU reads: given back at the next batch

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        """At set-up: the copier of a GPU ``storing_device``, where ``cuda_dma`` asks for it."""
        self._held, self._copies = [], []
        if self._cuda_dma and self._device is not None and self._device.type == "cuda":
            self._copier = DeviceCopier(self._device)

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
        loans = self.loans
        return {
            "batches": loans.outstanding,
            "bytes": loans.lent_bytes,
            "budget": loans.budget,
            "lent_so_far": loans.lent_batches,
            "copies_over_budget": loans.over_budget,
        }

    @property
    def pinned_bytes(self) -> int:
        """Bytes of shared memory registered with CUDA for copies to the GPU ``storing_device`` (``cuda_dma=True``;
        0 otherwise)."""
        return self._copier.registered_bytes if self._copier is not None else 0

    # -- per batch ---------------------------------------------------------------------------
    async def hand_out(
        self, pool: WorkerPool, items: list[Received], reshape: Callable[[TensorDictBase], TensorDictBase] | None
    ) -> TensorDictBase:
        """The batch of ``items``, lent, copied or on the GPU, ``reshape`` (postproc, ``split_trajs``) applied off
        the event loop; each item's memory is then given back to its worker, at once or once no longer read."""
        copier = self._copier
        loans: Loans | None = None
        if self._device is None and not self._copy_batches and await self._dispatch.can_lend(pool, items, self.loans):
            loans = self.loans
        try:
            if copier is None and self._device is not None:
                batch = await self._to_device(self._device, items, reshape)
            elif copier is not None:
                # Read where it lies, held until its copy ended (take_back): no CPU copy on the way.
                copy = copier.copy(self._dispatch.view(items))
                self._copies.append(copy)
                if reshape is None:
                    batch = copier.hand_over(copy)
                else:
                    # Reshaped in a thread, on that thread's stream: each side orders its own stream after the other.
                    reshaped, done = await anyio.to_thread.run_sync(copier.reshaped, copy, reshape)
                    batch = copier.hand_over_reshaped(reshaped, done)
            elif self._inline(items, lent=loans is not None, reshapes=reshape is not None):
                batch = self._combine(items, loans, reshape)
            else:
                # Off the event loop: combining (and postproc of) pixel batches takes milliseconds.
                batch = await anyio.to_thread.run_sync(self._combine, items, loans, reshape)
        finally:
            for item in items:
                if loans is not None:
                    await self._dispatch.lent(pool, item)
                elif copier is not None:
                    self._held.append(item)
                else:
                    await self.give_back(pool, item)
        return batch

    def _inline(self, items: list[Received], *, lent: bool, reshapes: bool) -> bool:
        # A small batch is combined on the event loop: its copy costs less than the hop to a thread (and the
        # trainer's CPU per batch is what the workers lose on a machine with few cores); a lent one costs no copy.
        # User code (postproc) stays in the thread.
        return not reshapes and (lent or sum(item.nbytes for item in items) <= INLINE_HAND_OUT_BYTES)

    def _combine(
        self,
        items: list[Received],
        loans: Loans | None,
        reshape: Callable[[TensorDictBase], TensorDictBase] | None,
    ) -> TensorDictBase:
        batch = self._dispatch.combine(items, loans=loans)
        return reshape(batch) if reshape is not None else batch

    async def _to_device(
        self,
        device: torch.device,
        items: list[Received],
        reshape: Callable[[TensorDictBase], TensorDictBase] | None,
    ) -> TensorDictBase:
        """The batch of ``items`` on ``device``, moved on this thread's current stream (the consumer's: this runs in
        ``__anext__``), so that its kernels queue behind the copy; the items' memory may be given back on return."""
        # Pageable memory: CUDA has read the source into its staging buffer when the call returns (only the DMA on to
        # the device may still be queued, on this stream), so nothing here outlives the workers' memory.
        batch = move_to(self._dispatch.view(items), device)
        if reshape is None:
            return batch
        # User code off the event loop, on the thread's own stream: ordered after the copy, and the consumer's stream
        # after it, by events (no host synchronization either way).
        copied = cuda_ready(_leaves(batch))

        def run() -> tuple[TensorDictBase, tuple[object, ...]]:
            order_after(copied, _leaves(batch))
            out = reshape(batch)
            return out, cuda_ready(_leaves(out))

        out, done = await anyio.to_thread.run_sync(run)
        order_after(done, _leaves(out))
        return out

    async def give_back(self, pool: WorkerPool, item: Received) -> None:
        """Gives ``item``'s memory back to its worker (with a credit where it collects on credits)."""
        if self._dispatch.give_back(item):  # a part of a shared segment: the collector's to free, not the worker's
            return
        handle = pool.handles[item.worker]
        slot = item.header.get("slot")
        # A lockstep worker collects only when asked: a credit means something to it only as a slot to free.
        if item.generation == handle.generation and (slot is not None or pool.settings.credits is not None):
            await self._dispatch.credit(pool, handle, slot)

    async def take_back(self, pool: WorkerPool) -> None:
        """Gives back what the caller dropped since the last batch, and what a finished copy to a GPU held."""
        for key, token in self.loans.returned():
            await self._dispatch.returned(pool, key, token)
        copies, self._copies = self._copies, []
        if copies and self._copier is not None:
            for copy in copies:  # long done, most of the time: a trainer used the batch since
                self._copier.copied(copy)
        held, self._held = self._held, []
        for item in held:
            await self.give_back(pool, item)


def _leaves(batch: TensorDictBase) -> list[torch.Tensor]:
    return [leaf for leaf in batch.values(include_nested=True, leaves_only=True) if isinstance(leaf, torch.Tensor)]
