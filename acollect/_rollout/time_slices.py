"""Per-step copies into the time slice of ``[E, T, ...]`` batch buffers, for the rollout engine.

The engine writes each step ``t`` of a batch from tensors it owns (the env's
observations, the policy's outputs). Where numpy can view both sides, the copy
goes through numpy: cheaper than a torch copy on small tensors, and no tensor
object is made per step.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["TimeSlices", "numpy_view", "write_output"]


def numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    """``tensor``'s memory as a numpy array, or None where numpy cannot view it (another device, bfloat16)."""
    if tensor.device.type != "cpu" or tensor.requires_grad:
        return None
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):
        return None


class TimeSlices:
    """Copies fixed source tensors into step ``t`` of ``[E, T, ...]`` buffers, once per step.

    Through numpy where numpy can view both sides: cheaper than a torch copy, and no tensor is made
    per step. (Keeping ``T`` views per buffer for a batch made ~2,000 tensors per batch, each tracked
    by the garbage collector; promoted from generation to generation while the batch filled, they
    brought on a full collection of the whole heap, 0.2-0.3 s with torch loaded, every minute or so.)
    """

    __slots__ = ("numpy_pairs", "torch_pairs")

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.numpy_pairs: list[tuple[np.ndarray, np.ndarray]] = []
        self.torch_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for dst, src in pairs:
            dst_np, src_np = numpy_view(dst), numpy_view(src)
            if dst_np is not None and src_np is not None and dst_np.dtype == src_np.dtype:
                self.numpy_pairs.append((dst_np, src_np))
            else:
                self.torch_pairs.append((dst, src))

    def copy(self, t: int) -> None:
        for dst_np, src_np in self.numpy_pairs:
            dst_np[:, t] = src_np
        for dst, src in self.torch_pairs:
            dst.select(1, t).copy_(src)


def write_output(value: torch.Tensor | None, buffer: torch.Tensor, buffer_np: np.ndarray | None, t: int) -> None:
    """Writes one policy output into step ``t`` of its ``[E, T, ...]`` buffer (see :class:`TimeSlices`)."""
    if value is None:  # the random policy writes only "action"
        buffer.select(1, t).zero_()
        return
    if buffer_np is not None and value.is_cpu:
        try:
            buffer_np[:, t] = value.numpy()
            return
        except (TypeError, RuntimeError):  # a tensor numpy cannot view (bfloat16, conjugate...)
            pass
    buffer.select(1, t).copy_(value)
