"""Batches to a CUDA device by DMA (``cuda_dma=True``): the pool's shared memory registered with CUDA, copied on a
side stream. Opt-in, and not yet run on a GPU: the default moves a batch with ``.to(device, non_blocking=True)`` on
the consumer's stream (:mod:`acollect.collectors._handout`).

A batch of a worker collector lies, in the main, in shared memory the pool created (a worker's slot ring, or a
lockstep segment every worker writes its rows of). To hand it out on a GPU, :class:`DeviceCopier` registers such a
segment with CUDA (``cudaHostRegister``: its pages become page-locked, so the GPU's copy engine reads them
directly), then copies the batch with ``non_blocking=True`` on a stream of its own: no CPU copy on the way, and the
copy overlaps whatever the consumer's stream runs. The batch is handed out with the consumer's current stream told
to wait for that copy (an event, not a host synchronization); the shared memory is given back to its worker only
once the copy finished (:meth:`DeviceCopier.copied`).

The rules it keeps:

- Only memory the pool owns is registered: a segment this process created (:attr:`ShmSegment.owner`), for as long
  as it is mapped. It is registered the first time a copy reads it and unregistered by the segment's own
  :meth:`~acollect._batches.shm.ShmSegment.before_unmap` hook (after the copies in flight finished), on the device
  it was registered on, so a registration never outlives its mapping.
- Everything else (a small batch that arrived as ZeroMQ frames on the heap, parts gathered into fresh memory, the
  worker-id tensor made per batch) is copied from pageable memory with a plain, waited-for copy: CUDA has read it
  when the copy returns, so the temporary may be freed at once.
- A refused registration raises :class:`~acollect.errors.ConfigurationError` naming ``cuda_dma=False``: torch's
  bindings cannot clear the error CUDA then leaves pending on the thread (the next kernel launch would report it as
  its own), so the copier does not carry on as if nothing happened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect._batches.shm import ShmSegment
from acollect._devices import wait_for_stream
from acollect.errors import ConfigurationError

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


def _code(result: Any) -> int:
    """A runtime call's ``cudaError`` as an int (torch's binding returns an enum member)."""
    return int(getattr(result, "value", result))


class DeviceCopier:
    """Copies CPU batches to one CUDA device on a side stream, by DMA where they lie in the pool's shared memory.

    See the module's notes for the rules it keeps.

    Args:
        device: the CUDA device batches go to.

    Raises:
        RuntimeError: CUDA is not available.
    """

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"a DeviceCopier needs an available CUDA device, got {device}")
        # "cuda" names whichever device is current at each call: fixed here, so that the stream, the events and the
        # consumer's stream are all on one device even if the caller changes the current device later.
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device)
        self._registered: dict[int, ShmSegment] = {}  # base address of a registered segment -> the segment

    @property
    def registered_bytes(self) -> int:
        """Bytes of shared memory registered with CUDA (page-locked) now."""
        return sum(segment.size for segment in self._registered.values())

    def _registered_segment(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lies in a segment the pool owns that is registered (registered now if it is new)."""
        segment = ShmSegment.containing(tensor.data_ptr())
        if segment is None or not segment.owner:
            return False
        base = segment.address
        if base is None:
            return False
        if base in self._registered:
            return True
        cudart = torch.cuda.cudart()
        code = _code(cudart.cudaHostRegister(base, segment.size, 0))
        if code != 0:
            raise ConfigurationError(
                f"cuda_dma=True: CUDA refused to register {segment.size} bytes of the workers' shared memory "
                f"({cudart.cudaGetErrorString(code)}, error {code}); the error stays pending on this thread and the "
                "next CUDA call may report it. Pass cuda_dma=False (the default), which needs no registration."
            )
        self._registered[base] = segment
        segment.before_unmap(self._unregister)  # unregistered before it is unmapped, never after
        return True

    def _unregister(self, segment: ShmSegment) -> None:
        """The segment is about to be unmapped: the copies reading it finish first, then it is unregistered."""
        base = segment.address
        if base is None:
            return
        if self._registered.pop(base, None) is not None:
            wait_for_stream(self.stream)
            self._host_unregister(base)

    def _host_unregister(self, base: int) -> None:
        # Under the device it was registered on (inside copy(), on the copier's stream): the hook that calls this may
        # run with another device current.
        with torch.cuda.device(self.device):
            code = _code(torch.cuda.cudart().cudaHostUnregister(base))
        if code != 0:
            logger.warning("cudaHostUnregister failed at %#x (error %s): its pages may stay locked", base, code)

    def copy(self, batch: TensorDictBase) -> Copy:
        """Starts copying ``batch`` (CPU) to the device; returns the copy in flight.

        Leaves in the pool's registered shared memory go by DMA, not waited for (their memory is held until
        :meth:`copied`); any other leaf is copied from pageable memory and read by CUDA before this returns.
        """
        device = self.device

        def move(leaf: torch.Tensor) -> torch.Tensor:
            if self._registered_segment(leaf):
                return leaf.to(device, non_blocking=True)  # the source is held until copied() says it landed
            return leaf.to(device)  # pageable: read before it returns, so a temporary may go at once

        with torch.cuda.stream(self.stream):
            on_device = batch.apply(move, device=device)
            assert on_device is not None  # apply returns None only when told to work in place
            event = torch.cuda.Event(blocking=True)  # copied() waits for it: sleeping, not spinning
            event.record(self.stream)
        return Copy(on_device, event)

    def hand_over(self, copy: Copy) -> TensorDictBase:
        """The device batch, ordered after its copy on the caller's current stream (no host synchronization).

        The memory was allocated on the copier's stream and is used on the caller's: it is recorded on the caller's
        stream too, so the caching allocator never gives it to another tensor while the caller's work is queued.
        """
        return self._ordered(copy.batch, copy.event)

    def reshaped(self, copy: Copy, reshape: Callable[[TensorDictBase], TensorDictBase]) -> tuple[TensorDictBase, Any]:
        """``reshape`` (postproc, ``split_trajs``) run on the device batch by the calling thread (a worker thread,
        off the event loop), after the copy; returns the result and the event its work was queued before, for
        :meth:`hand_over_reshaped` on the consumer's thread (whose streams are not this thread's)."""
        batch = reshape(self.hand_over(copy))
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        return batch, done

    def hand_over_reshaped(self, batch: TensorDictBase, done: Any) -> TensorDictBase:
        """A batch of :meth:`reshaped`, ordered after its reshaping on the caller's current stream."""
        return self._ordered(batch, done)

    def _ordered(self, batch: TensorDictBase, event: Any) -> TensorDictBase:
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for leaf in batch.values(include_nested=True, leaves_only=True):
            if isinstance(leaf, torch.Tensor) and leaf.device == consumer.device:
                leaf.record_stream(consumer)
        return batch

    def copied(self, copy: Copy) -> None:
        """Blocks until ``copy`` finished: its source memory may then be given back to its worker."""
        copy.wait()

    def close(self) -> None:
        """Waits for every copy in flight and unregisters the memory (before it is unmapped). Idempotent."""
        wait_for_stream(self.stream)
        for base in list(self._registered):
            del self._registered[base]
            self._host_unregister(base)
