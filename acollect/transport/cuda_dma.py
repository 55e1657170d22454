"""Batches to a CUDA device by DMA: shared memory registered with CUDA, copied on a side stream.

A batch of a worker collector lies in shared memory (a worker's slot, or a lockstep segment every worker writes
its rows of). To hand it out on a GPU, :class:`DeviceCopier` registers that memory with CUDA once
(``cudaHostRegister``: the pages become page-locked, so the GPU's copy engine reads them directly), then copies the
batch with ``non_blocking=True`` on a stream of its own: no CPU copy on the way, and the copy overlaps whatever the
consumer's stream runs. The batch is handed out with the consumer's current stream told to wait for that copy
(an event, not a host synchronization), so the consumer never sees a half-copied batch and its first kernel on it
queues behind the copy; the shared memory is given back to its worker only once the copy finished
(:meth:`DeviceCopier.copied`).

Where registering fails (a system that refuses to lock the pages, a segment mapped twice), the copy goes from
pageable memory instead: correct, only not overlapped.

Registered memory must be unregistered before it is unmapped: :meth:`DeviceCopier.close` waits for the copies in
flight and unregisters everything; the collector calls it before its pool unmaps the segments.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["Copy", "DeviceCopier"]

logger = logging.getLogger("acollect")


class Copy:
    """One batch on its way to the device: the device batch and the event its copy recorded."""

    __slots__ = ("batch", "event")

    def __init__(self, batch: TensorDictBase, event: Any) -> None:
        self.batch = batch
        self.event = event

    @property
    def done(self) -> bool:
        """Whether the copy finished (the source memory may be written again)."""
        return bool(self.event.query())

    def wait(self) -> None:
        """Blocks until the copy finished."""
        self.event.synchronize()


class DeviceCopier:
    """Copies CPU batches to one CUDA device by DMA on a side stream (see the module's notes).

    Args:
        device: the CUDA device batches go to.

    Raises:
        RuntimeError: CUDA is not available.
    """

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"a DeviceCopier needs an available CUDA device, got {device}")
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._registered: dict[int, int] = {}  # base address of a registered mapping -> its bytes
        self._refused: set[int] = set()  # mappings CUDA would not register: copied from pageable memory
        self._pending: list[Copy] = []  # copies whose source is not given back yet

    @property
    def registered_bytes(self) -> int:
        """Bytes of shared memory registered with CUDA (page-locked) so far."""
        return sum(self._registered.values())

    def _register(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        base, nbytes = storage.data_ptr(), storage.nbytes()
        if base in self._registered or base in self._refused or nbytes == 0:
            return
        error = torch.cuda.cudart().cudaHostRegister(base, nbytes, 0)
        code = getattr(error, "value", error)
        if code != 0:
            self._refused.add(base)
            logger.debug("cudaHostRegister refused %d bytes at %#x (error %s): copied from pageable memory",
                         nbytes, base, code)  # fmt: skip
            return
        self._registered[base] = nbytes

    def copy(self, batch: TensorDictBase) -> Copy:
        """Starts copying ``batch`` (CPU, shared memory) to the device; returns the copy in flight."""
        for leaf in batch.values(include_nested=True, leaves_only=True):
            if isinstance(leaf, torch.Tensor):
                self._register(leaf)
        with torch.cuda.stream(self.stream):
            on_device = batch.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        copy = Copy(on_device, event)
        self._pending.append(copy)
        return copy

    def hand_over(self, copy: Copy) -> TensorDictBase:
        """The device batch, ordered after its copy on the caller's current stream (no host synchronization).

        The memory was allocated on the copier's stream and is used on the caller's: it is recorded on the caller's
        stream too, so the caching allocator never gives it to another tensor while the caller's work is queued.
        """
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(copy.event)
        for leaf in copy.batch.values(include_nested=True, leaves_only=True):
            if isinstance(leaf, torch.Tensor):
                leaf.record_stream(consumer)
        return copy.batch

    def copied(self, copy: Copy) -> None:
        """Blocks until ``copy`` finished: its source memory may then be given back to its worker."""
        copy.wait()
        if copy in self._pending:
            self._pending.remove(copy)

    def close(self) -> None:
        """Waits for every copy in flight and unregisters the memory (before it is unmapped). Idempotent."""
        self.stream.synchronize()
        self._pending.clear()
        cudart = torch.cuda.cudart()
        for base in list(self._registered):
            cudart.cudaHostUnregister(base)
            del self._registered[base]
        self._refused.clear()
