"""How policy weights travel from the trainer to worker processes, without pickle.

:func:`flatten_params` copies every tensor of a state dict or TensorDict into one contiguous,
64-byte aligned ``uint8`` buffer and describes them in a msgpack-able layout; the receiver
checks the layout against its own parameters (:func:`plan_unflatten`, every model of a push
before any is copied) and copies straight into them (:func:`copy_planned`, or both at once,
:func:`unflatten_into`). A malformed or mismatched layout raises
:class:`~acollect.errors.ProtocolError` before any parameter is touched.

A *scheme* says how one model's buffer is carried; ``weight_sync_schemes`` on a multi-process
collector maps model ids to schemes, and each push serializes the weights once:

* :class:`ZmqWeightSyncScheme`: the buffer is one raw frame of the weights message, sent to
  each worker (works over ``tcp://`` too);
* :class:`SharedMemWeightSyncScheme`: the buffer *is* a ``/dev/shm`` segment owned by the
  collector, written once and read by every local worker; the message only names it. The
  default for local workers where ``/dev/shm`` exists.

A worker finds the buffers of a ``weights`` message (frames, a segment, or a torch.distributed
broadcast) with :func:`read_weights`.

Examples:
    >>> from acollect._weights.sync import SharedMemWeightSyncScheme
    >>> schemes = {"policy": SharedMemWeightSyncScheme()}
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from acollect._batches.shm import ShmSegment
from acollect._runtime.layout import (
    Key,
    _check_int,
    _check_keys_disjoint,
    _check_leaf,
    _dtype_name,
    _fail,
    _normalize_key,
    aligned_offsets,
)
from acollect._runtime.wire import _as_bytes_view, _walk
from acollect.errors import ConfigurationError, ProtocolError

if TYPE_CHECKING:
    from acollect._runtime.torch_dist import DistLink

__all__ = [
    "SharedMemWeightSyncScheme",
    "Staged",
    "WeightPlan",
    "WeightSyncScheme",
    "WeightWriter",
    "ZmqWeightSyncScheme",
    "copy_planned",
    "flatten_params",
    "plan_unflatten",
    "read_weights",
    "unflatten_into",
]

Params = TensorDictBase | Mapping[Any, torch.Tensor]


def _param_items(tensors: Params) -> list[tuple[Key, torch.Tensor]]:
    if isinstance(tensors, TensorDictBase):
        found: list[tuple[Key, torch.Tensor]] = []
        _walk(tensors, (), found, [])
        return found
    if isinstance(tensors, Mapping):
        items = []
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise ConfigurationError.bad_value(f"tensors[{key!r}]", type(value).__name__, "a torch.Tensor")
            items.append((_normalize_key(key, "tensors key"), value))
        return items
    raise ConfigurationError.bad_value("tensors", type(tensors).__name__, "a TensorDict or a mapping of tensors")


def flatten_params(tensors: Params, *, out: torch.Tensor | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """Copies every tensor into one flat, aligned ``uint8`` buffer.

    Args:
        tensors: a TensorDict (e.g. ``TensorDict.from_module(policy)``) or a state dict.
        out: an optional preallocated contiguous 1-D ``uint8`` CPU tensor (e.g. a
            shared-memory view) at least ``layout["nbytes"]`` long, reused across pushes.

    Returns:
        ``(layout, flat)``: a msgpack-able layout (key, dtype, shape, offset, nbytes
        of each tensor, total nbytes) and the flat buffer.

    Examples:
        >>> layout, flat = flatten_params({"w": torch.ones(2, 2), "b": torch.zeros(2)})
        >>> layout["nbytes"], flat.dtype
        (72, torch.uint8)
    """
    items = _param_items(tensors)
    offsets, total = aligned_offsets([t.numel() * t.element_size() for _, t in items])
    leaves = [
        {
            "key": list(key),
            "dtype": _dtype_name(t.dtype, key),
            "shape": list(t.shape),
            "offset": off,
            "nbytes": t.numel() * t.element_size(),
        }
        for (key, t), off in zip(items, offsets, strict=True)
    ]
    if out is None:
        out = torch.empty(total, dtype=torch.uint8)
    elif (
        out.dtype != torch.uint8
        or out.dim() != 1
        or not out.is_contiguous()
        or out.numel() < total
        or out.device.type != "cpu"
        or out.storage_offset() % 16  # so that every leaf can be viewed as its own dtype
    ):
        raise ConfigurationError.bad_value(
            "out", out, f"a contiguous, 16-byte aligned 1-D uint8 CPU tensor of at least {total} bytes"
        )
    with torch.no_grad():
        for (_, tensor), off in zip(items, offsets, strict=True):
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes:
                out.narrow(0, off, nbytes).view(tensor.dtype).view(tensor.shape).copy_(tensor)
    return {"leaves": leaves, "nbytes": total}, out


def _lookup(target: Params, key: Key) -> torch.Tensor | None:
    if isinstance(target, TensorDictBase):
        value = target.get(key, None)
    else:
        value = target.get(key[0] if len(key) == 1 else key)
    return value if isinstance(value, torch.Tensor) else None


#: What :func:`plan_unflatten` checked: (key, source bytes, dtype, shape, destination) per tensor.
WeightPlan = list[tuple[Key, torch.Tensor, torch.dtype, tuple[int, ...], torch.Tensor]]


def plan_unflatten(
    layout: object,
    flat: torch.Tensor | object,
    target: Params | MutableMapping[Any, torch.Tensor],
    *,
    strict: bool = True,
) -> WeightPlan:
    """Checks a received layout against ``flat`` and ``target`` and says what goes where; copies nothing.

    A receiver checks every model of a push first and copies (:func:`copy_planned`) only if all fit,
    so a bad push is refused whole and changes nothing.

    Raises:
        ProtocolError: as :func:`unflatten_into`.
    """
    if not isinstance(layout, dict) or not isinstance(layout.get("leaves"), list):
        raise _fail("weight layout must be a map with a list of leaves")
    if not isinstance(flat, torch.Tensor):
        view = _as_bytes_view(flat, 1)
        flat = torch.frombuffer(view, dtype=torch.uint8) if view.nbytes else torch.empty(0, dtype=torch.uint8)
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise _fail(f"flat weights must be a 1-D uint8 tensor, got {flat.dtype} of shape {list(flat.shape)}")
    plan: WeightPlan = []
    for entry in layout["leaves"]:
        leaf = _check_leaf(entry, flat.numel())
        offset = _check_int(entry.get("offset"), f"offset of {leaf.key!r}", flat.numel())
        if offset % leaf.dtype.itemsize:
            raise _fail(f"weight {leaf.key!r} starts at byte {offset}, not a multiple of its item size")
        if offset + leaf.nbytes > flat.numel():
            raise _fail(f"weight {leaf.key!r} ends at byte {offset + leaf.nbytes}, past the {flat.numel()} received")
        tensor = _lookup(target, leaf.key)
        if tensor is None:
            raise _fail(f"weight {leaf.key!r} has no tensor to go to in the target")
        if tensor.dtype != leaf.dtype or tuple(tensor.shape) != leaf.shape:
            raise _fail(
                f"weight {leaf.key!r} is {leaf.dtype} {list(leaf.shape)}, "
                f"the target holds {tensor.dtype} {list(tensor.shape)}"
            )
        source = flat.narrow(0, offset, leaf.nbytes)
        if leaf.dtype is torch.bool and bool((source > 1).any()):
            raise _fail(f"bool weight {leaf.key!r} holds bytes other than 0 and 1")
        if source.storage_offset() % leaf.dtype.itemsize:
            source = source.clone()  # a caller's unaligned slice cannot be viewed as a wider dtype
        plan.append((leaf.key, source, leaf.dtype, leaf.shape, tensor))
    _check_keys_disjoint([key for key, *_ in plan])
    if strict:
        wanted = {key for key, *_ in plan}
        extra = [key for key, _ in _param_items(target) if key not in wanted]
        if extra:
            raise _fail(f"the weights lack {len(extra)} tensors the target holds, e.g. {extra[0]!r}")
    return plan


def copy_planned(plan: WeightPlan) -> None:
    """Copies what :func:`plan_unflatten` checked into the target's tensors."""
    with torch.no_grad():
        for _, source, dtype, shape, tensor in plan:
            if source.numel():
                tensor.detach().copy_(source.view(dtype).view(shape))


def unflatten_into(
    layout: object,
    flat: torch.Tensor | object,
    target: Params | MutableMapping[Any, torch.Tensor],
    *,
    strict: bool = True,
) -> None:
    """Copies the tensors of a flat buffer into the existing tensors of ``target``.

    Args:
        layout: the layout :func:`flatten_params` returned (received from a peer).
        flat: the flat buffer, a ``uint8`` tensor or any bytes-like object.
        target: where to copy to: a TensorDict or a state dict (tensors are updated in place).
        strict: also require that ``target`` holds no tensor the layout lacks.

    Raises:
        ProtocolError: the layout is malformed, does not fit ``flat``, or does not
            match ``target`` (missing key, other dtype or shape).

    Examples:
        >>> params = {"w": torch.zeros(2)}
        >>> layout, flat = flatten_params({"w": torch.ones(2)})
        >>> unflatten_into(layout, flat, params); params["w"]
        tensor([1., 1.])
    """
    # Everything is checked before the first copy, so a bad message never leaves the
    # target half updated.
    copy_planned(plan_unflatten(layout, flat, target, strict=strict))


# -- schemes: how a buffer is carried ------------------------------------------------------------
class WeightWriter:
    """One collector's writer for one model (holds its buffers between pushes)."""

    def write(self, params: TensorDictBase) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Serializes ``params``; returns the message entry and the frame to send (or ``None``)."""
        raise NotImplementedError

    def unlink(self) -> None:
        """Removes the names of its buffers, once every reader mapped them (they stay mapped here, and are
        rewritten by the next push): nothing is left behind if this process is killed."""

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

    def unlink(self) -> None:
        if self._segment is not None:
            self._segment.unlink()

    def close(self) -> None:
        segment, self._segment = self._segment, None
        if segment is not None:
            segment.close()
            segment.unlink()


class SharedMemWeightSyncScheme(WeightSyncScheme):
    """Weights written once into a ``/dev/shm`` segment that every local worker reads (same host only)."""

    def make_writer(self) -> WeightWriter:
        return _ShmWriter()


# -- a worker's side: where the buffers of a weights message are ------------------------------
#: model id -> (layout, flat buffer) of one ``weights`` message.
Staged = dict[str, tuple[Any, torch.Tensor]]


def read_weights(
    header: dict[str, Any], td: TensorDictBase | None, segments: dict[str, ShmSegment], dist: DistLink | None
) -> Staged:
    """model id -> (layout, flat buffer) of a ``weights`` message (from frames, a segment or a broadcast).

    ``segments`` caches the shared-memory segments attached so far (one per model, rewritten by each push).
    """
    models = header["models"]
    if not isinstance(models, list):
        raise ProtocolError(f"weights models is a {type(models).__name__}, expected a list")
    staged: Staged = {}
    # DistributedCollector: the flat buffers follow as one broadcast per model, not as frames.
    broadcast = (
        dist.recv_weights([int(m["layout"]["nbytes"]) for m in models])
        if header.get("dist") and dist is not None
        else None
    )
    for i, model in enumerate(models):
        shm = model.get("shm")
        if broadcast is not None:
            flat = broadcast[i]
        elif shm is not None:
            segment = segments.get(shm)
            if segment is None:
                segment = ShmSegment.attach(shm, int(model["layout"]["nbytes"]))
                segments[shm] = segment
            flat = segment.tensor()
        else:
            frame = td.get(f"m{i}") if td is not None else None
            if not isinstance(frame, torch.Tensor):
                raise ProtocolError(f"weights message lacks the frame of model {i}")
            flat = frame
        staged[str(model["id"])] = (model["layout"], flat)
    return staged
