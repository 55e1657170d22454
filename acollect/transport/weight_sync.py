"""How policy weights travel from the trainer to worker processes.

A *scheme* says how one model's weights are carried; ``weight_sync_schemes`` on
a multi-process collector maps model ids to schemes. Both schemes serialize the
weights once per push into one flat, aligned buffer
(:func:`acollect.transport.weights.flatten_params`), never with pickle, and
every worker copies from it straight into its own parameters:

* :class:`ZmqWeightSyncScheme`: the buffer is one raw frame of the weights
  message, sent to each worker (works over ``tcp://`` too);
* :class:`SharedMemWeightSyncScheme`: the buffer *is* a ``/dev/shm`` segment
  owned by the collector, written once and read by every local worker; the
  message only names it. The default for local workers where ``/dev/shm``
  exists.

Examples:
    >>> from acollect.transport.weight_sync import SharedMemWeightSyncScheme
    >>> schemes = {"policy": SharedMemWeightSyncScheme()}
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from acollect.errors import ConfigurationError
from acollect.transport.shm import ShmSegment
from acollect.transport.weights import flatten_params

__all__ = ["SharedMemWeightSyncScheme", "WeightSyncScheme", "WeightWriter", "ZmqWeightSyncScheme"]


class WeightWriter:
    """One collector's writer for one model (holds its buffers between pushes)."""

    def write(self, params: TensorDictBase) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Serializes ``params``; returns the message entry and the frame to send (or ``None``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases the writer's buffers (idempotent)."""


class WeightSyncScheme:
    """How one model's weights are carried to workers. Subclasses build a :class:`WeightWriter`."""

    def make_writer(self) -> WeightWriter:
        """A fresh writer for one collector."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _FrameWriter(WeightWriter):
    def write(self, params: TensorDictBase) -> tuple[dict[str, Any], torch.Tensor | None]:
        # A fresh buffer per push: ZeroMQ may still hold the previous one (frames go without a copy).
        layout, flat = flatten_params(params)
        return {"layout": layout, "shm": None}, flat


class ZmqWeightSyncScheme(WeightSyncScheme):
    """Weights as one raw frame in the ZeroMQ weights message (any address, ``ipc://`` or ``tcp://``)."""

    def make_writer(self) -> WeightWriter:
        return _FrameWriter()


class _ShmWriter(WeightWriter):
    def __init__(self) -> None:
        self._segment: ShmSegment | None = None

    def write(self, params: TensorDictBase) -> tuple[dict[str, Any], torch.Tensor | None]:
        segment = self._segment
        if segment is not None:
            try:
                layout, _ = flatten_params(params, out=segment.tensor())
                if layout["nbytes"] == segment.size:
                    return {"layout": layout, "shm": segment.name}, None
            except ConfigurationError:
                pass  # the weights grew: a new segment
        # First push (or new sizes): learn the layout, then keep a segment of exactly that size.
        layout, flat = flatten_params(params)
        self.close()
        segment = self._segment = ShmSegment.create(int(layout["nbytes"]))
        segment.tensor().copy_(flat)
        return {"layout": layout, "shm": segment.name}, None

    def close(self) -> None:
        segment, self._segment = self._segment, None
        if segment is not None:
            segment.close()
            segment.unlink()


class SharedMemWeightSyncScheme(WeightSyncScheme):
    """Weights written once into a ``/dev/shm`` segment that every local worker reads (same host only)."""

    def make_writer(self) -> WeightWriter:
        return _ShmWriter()
