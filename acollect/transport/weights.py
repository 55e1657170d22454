"""Flat weight buffers: push policy weights without pickle.

:func:`flatten_params` copies every tensor of a state dict or TensorDict into one
contiguous ``uint8`` tensor, each at a 64-byte aligned offset, and describes them
in a msgpack-able layout. The buffer travels as one frame (or sits in a
shared-memory segment); :func:`unflatten_into` checks the layout against the
receiver's own parameters and copies straight into them. A malformed or
mismatched layout raises :class:`~acollect.errors.ProtocolError` before any
parameter is touched.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect.errors import ConfigurationError
from acollect.transport.layout import (
    Key,
    _check_int,
    _check_keys_disjoint,
    _check_leaf,
    _dtype_name,
    _fail,
    _normalize_key,
    aligned_offsets,
)
from acollect.transport.wire import _as_bytes_view, _walk

__all__ = ["WeightPlan", "copy_planned", "flatten_params", "plan_unflatten", "unflatten_into"]

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
