"""The TensorDict layout: how a message or a shared-memory slot describes its tensors.

A layout is a msgpack-able map (``batch_size``, ``names``, ``leaves``, ``subs``) that
:func:`~acollect._runtime.wire.encode_tensordict` makes and every receiver checks.
This module's one job is that description: :func:`validate_layout` turns a layout a
peer sent into a :class:`TensorDictLayout` or raises
:class:`~acollect.errors.ProtocolError` with a reason (whitelisted dtypes, bounded
sizes, consistent shapes and keys), and :func:`build_tensordict` assembles validated
leaves into a TensorDict. The frames around it are :mod:`acollect._runtime.wire`'s;
shared-memory slots (:mod:`acollect._batches.shm`) lay leaves out at
:func:`aligned_offsets`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ConfigurationError, ProtocolError

__all__ = [
    "ALIGNMENT",
    "DEFAULT_MAX_BYTES",
    "Key",
    "LeafLayout",
    "TensorDictLayout",
    "aligned_offsets",
    "build_tensordict",
    "combined_layout",
    "part_of",
    "validate_layout",
]

#: Byte alignment of every leaf inside a flat weight buffer or a shared-memory slot.
ALIGNMENT = 64
#: Default ceiling on the tensor bytes one message may make the receiver hold (16 GiB).
DEFAULT_MAX_BYTES = 1 << 34
_MAX_NDIM = 64
_MAX_DIM = 1 << 48  # dims of empty tensors are not bounded by their (zero) bytes
_MAX_KEY_DEPTH = 32

_WIRE_DTYPES: tuple[torch.dtype, ...] = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_WIRE_DTYPES += (torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64)
_WIRE_DTYPES += (torch.complex64, torch.complex128)
_DTYPES: dict[str, torch.dtype] = {str(dtype).removeprefix("torch."): dtype for dtype in _WIRE_DTYPES}
_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in _DTYPES.items()}

Key = tuple[str, ...]


@dataclass(frozen=True)
class LeafLayout:
    """One validated tensor of a layout: where it lives and what it holds."""

    key: Key
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class TensorDictLayout:
    """A validated TensorDict layout (see :func:`validate_layout`)."""

    batch_size: tuple[int, ...]
    names: tuple[str | None, ...] | None
    leaves: tuple[LeafLayout, ...]
    subs: tuple[tuple[Key, tuple[int, ...]], ...]

    @property
    def nbytes(self) -> int:
        """Total bytes of all leaves (without alignment padding)."""
        return sum(leaf.nbytes for leaf in self.leaves)


def aligned_offsets(nbytes: Sequence[int], alignment: int = ALIGNMENT) -> tuple[list[int], int]:
    """Packs blocks of the given sizes one after the other at aligned offsets.

    Returns:
        The offset of each block and the total size.

    Examples:
        >>> aligned_offsets([3, 64, 0, 1])
        ([0, 64, 128, 128], 129)
    """
    offsets, end = [], 0
    for size in nbytes:
        start = -(-end // alignment) * alignment
        offsets.append(start)
        end = start + size
    return offsets, end


def _normalize_key(key: object, where: str) -> Key:
    key_tuple = (key,) if isinstance(key, str) else key
    if not isinstance(key_tuple, tuple) or not key_tuple or not all(isinstance(k, str) for k in key_tuple):
        raise ConfigurationError.bad_value(where, key, "a str or a non-empty tuple of str")
    return key_tuple


def _dtype_name(dtype: torch.dtype, key: Key) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ConfigurationError.bad_value(
            f"dtype of {key!r}", dtype, f"one of the wire dtypes {sorted(_DTYPES)}"
        ) from None


# --------------------------------------------------------------------------- validation


def _fail(reason: str) -> ProtocolError:
    return ProtocolError(f"malformed message: {reason}")


def _check_int(value: object, what: str, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise _fail(f"{what}={value!r}, expected an int in [0, {high}]")
    return value


def _check_dims(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > _MAX_NDIM:
        raise _fail(f"{what}={value!r:.200}, expected a list of at most {_MAX_NDIM} ints")
    return tuple(_check_int(d, f"{what} dim", _MAX_DIM) for d in value)


def _check_key(value: object, what: str) -> Key:
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= _MAX_KEY_DEPTH
        or not all(isinstance(k, str) and k for k in value)
    ):
        raise _fail(f"{what}={value!r:.200}, expected a list of 1 to {_MAX_KEY_DEPTH} non-empty str")
    return tuple(value)


def _check_leaf(entry: object, max_bytes: int) -> LeafLayout:
    if not isinstance(entry, dict):
        raise _fail(f"leaf {entry!r:.200} is not a map")
    key = _check_key(entry.get("key"), "leaf key")
    dtype_name = entry.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in _DTYPES:
        raise _fail(f"leaf {key!r} has dtype {dtype_name!r:.100}, expected one of {sorted(_DTYPES)}")
    dtype = _DTYPES[dtype_name]
    shape = _check_dims(entry.get("shape"), f"shape of {key!r}")
    nbytes = _check_int(entry.get("nbytes"), f"nbytes of {key!r}", max_bytes)
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise _fail(f"leaf {key!r} declares {nbytes} bytes but shape {list(shape)} of {dtype_name} needs {expected}")
    return LeafLayout(key, dtype, shape, nbytes)


def _check_keys_disjoint(keys: Sequence[Key]) -> None:
    seen = set(keys)
    if len(seen) != len(keys):
        raise _fail("a leaf key appears twice")
    for key in keys:
        for depth in range(1, len(key)):
            if key[:depth] in seen:
                raise _fail(f"leaf key {key!r} is nested under leaf {key[:depth]!r}")


def validate_layout(layout: object, *, max_bytes: int = DEFAULT_MAX_BYTES) -> TensorDictLayout:
    """Checks a layout received from a peer and returns its validated form.

    Raises:
        ProtocolError: anything is missing, of the wrong type, inconsistent, or
            the leaves hold more than ``max_bytes`` in total.

    Examples:
        >>> validate_layout({"batch_size": [2], "names": None, "leaves": [], "subs": []}).batch_size
        (2,)
    """
    if not isinstance(layout, dict):
        raise _fail(f"tensor layout is a {type(layout).__name__}, expected a map")
    batch_size = _check_dims(layout.get("batch_size"), "batch_size")
    names = layout.get("names")
    if names is not None:
        if not isinstance(names, list) or len(names) != len(batch_size):
            raise _fail(f"names={names!r:.200} do not match batch_size {list(batch_size)}")
        given = [n for n in names if n is not None]
        if not all(isinstance(n, str) for n in given) or len(set(given)) != len(given):
            raise _fail(f"names={names!r:.200}, expected distinct str or None")
        names = tuple(names)
    raw_leaves = layout.get("leaves")
    if not isinstance(raw_leaves, list):
        raise _fail("tensor layout has no list of leaves")
    leaves = tuple(_check_leaf(entry, max_bytes) for entry in raw_leaves)
    total = sum(leaf.nbytes for leaf in leaves)
    if total > max_bytes:
        raise _fail(f"tensors hold {total} bytes, more than the allowed {max_bytes}")
    for leaf in leaves:
        if leaf.shape[: len(batch_size)] != batch_size:
            raise _fail(
                f"leaf {leaf.key!r} of shape {list(leaf.shape)} does not start with batch_size {list(batch_size)}"
            )
    _check_keys_disjoint([leaf.key for leaf in leaves])
    raw_subs = layout.get("subs", [])
    if not isinstance(raw_subs, list):
        raise _fail("tensor layout subs is not a list")
    subs = []
    for entry in raw_subs:
        if not isinstance(entry, dict):
            raise _fail(f"sub-tensordict {entry!r:.200} is not a map")
        subs.append((_check_key(entry.get("key"), "sub key"), _check_dims(entry.get("batch_size"), "sub batch_size")))
    return TensorDictLayout(batch_size, names, leaves, tuple(subs))


def unchecked_node(source: dict[Any, Any], batch_size: torch.Size, names: Sequence[str | None] | None) -> TensorDict:
    """One TensorDict node over ``source`` (its tensors and built sub-nodes), through tensordict's private constructor,
    which checks nothing: only where :data:`FAST_ASSEMBLY` holds, over what fits the batch size already."""
    # A list per node: renaming one renames no other. (Any: tensordict's annotation leaves out the None it takes.)
    node_names: Any = list(names) if names is not None else None
    return TensorDict._new_unsafe(source, batch_size=batch_size, names=node_names, nested=False)


def _unchecked(source: dict[Any, Any], batch_size: torch.Size, names: tuple[str | None, ...] | None) -> TensorDict:
    """The TensorDict of nested dicts of tensors that fit it, each node with the batch size and dim names (as the
    checked constructor gives them)."""
    for key, value in source.items():
        if type(value) is dict:
            source[key] = _unchecked(value, batch_size, names)
    return unchecked_node(source, batch_size, names)


def _private_constructor_works() -> bool:
    """Whether tensordict's private constructor (and the node dicts it fills) give here what the checked constructor
    gives: tried once, on a small nested TensorDict with dim names. A tensordict whose internals moved falls back to
    the checked constructor everywhere these are used."""
    try:
        leaf = torch.zeros(2, 3)
        fast = _unchecked({"a": leaf, "n": {"b": leaf}}, torch.Size([2]), ("time",))
        checked = TensorDict({"a": leaf, "n": {"b": leaf}}, batch_size=[2], names=["time"])
        sub = fast._tensordict["n"]
        return (
            type(sub) is TensorDict
            and sub._tensordict["b"] is leaf
            and fast.names == checked.names
            and fast["n"].names == checked["n"].names
            and fast["n"].batch_size == checked["n"].batch_size
            and fast._td_dim_names is not sub._td_dim_names
        )
    except Exception:  # anything at all: the checked constructor stays
        return False


#: Whether the decoding and the lending here may assemble TensorDicts through tensordict's private constructor.
FAST_ASSEMBLY = _private_constructor_works()


def build_tensordict(spec: TensorDictLayout, tensors: Sequence[torch.Tensor]) -> TensorDict:
    """Assembles one tensor per leaf of a validated layout into a TensorDict.

    The tensors are used as they are (not copied): views over received frames or over
    a shared-memory slot stay views.

    Raises:
        ProtocolError: the tensors do not form a TensorDict of the layout's batch size.

    Examples:
        >>> leaf = {"key": ["next", "obs"], "dtype": "int64", "shape": [2], "nbytes": 16}
        >>> spec = validate_layout({"batch_size": [2], "names": None, "leaves": [leaf], "subs": []})
        >>> build_tensordict(spec, [torch.arange(2)])["next", "obs"]
        tensor([0, 1])
    """
    source: dict[str, Any] = {}
    for leaf, tensor in zip(spec.leaves, tensors, strict=True):
        node = source
        for part in leaf.key[:-1]:
            node = node.setdefault(part, {})
        node[leaf.key[-1]] = tensor
    try:
        # validate_layout checked what the constructor would (every leaf starts with the batch size, no key twice):
        # on a small batch, checking it again would cost the trainer more than the rest of its decoding.
        if FAST_ASSEMBLY:
            td = _unchecked(source, torch.Size(spec.batch_size), spec.names)
        else:
            names: Any = spec.names  # tensordict's annotation leaves out the None it takes
            td = TensorDict(source, batch_size=spec.batch_size, names=names)
        for key, batch_size in sorted(spec.subs, key=lambda sub: len(sub[0])):
            if key in td.keys(include_nested=True):
                td.get(key).batch_size = batch_size
            else:
                td.set(key, TensorDict(batch_size=batch_size))
    except Exception as exc:  # tensordict's own checks, on data a peer controls
        raise _fail(f"tensors do not form a TensorDict: {exc}") from exc
    return td


# --------------------------------------------------------------------------- batches made of parts


def _resized(layout: dict[str, Any], first: int | None, *, stack: bool) -> dict[str, Any]:
    """``layout`` with its first dim replaced by ``first`` (``stack``: a new first dim of that size)."""

    def dims(shape: list[int]) -> list[int]:
        if first is None:
            return list(shape[1:]) if not stack else list(shape)
        return [first, *shape] if stack else [first, *shape[1:]]

    def scale(nbytes: int, shape: list[int]) -> int:
        return math.prod(dims(shape)) * (nbytes // max(1, math.prod(shape))) if first is not None else 0

    names = layout["names"]
    if names is not None and stack and first is not None:
        names = [None, *names]
    return {
        "batch_size": dims(layout["batch_size"]),
        "names": names,
        "leaves": [
            {**leaf, "shape": dims(leaf["shape"]), "nbytes": scale(leaf["nbytes"], leaf["shape"])}
            for leaf in layout["leaves"]
        ],
        "subs": [{**sub, "batch_size": dims(sub["batch_size"])} for sub in layout["subs"]],
    }


def combined_layout(parts: Sequence[dict[str, Any]], *, stack: bool) -> tuple[dict[str, Any], list[Any]] | None:
    """The layout of a batch made of ``parts``, and where each part lies in it; ``None`` if they do not combine so.

    ``stack``: the parts, all of one layout, stacked along a new first dim (part ``i`` is index ``i``);
    else concatenated along their first dim (part ``i`` is rows ``[start, stop)``), which needs every
    other dim, the keys and the dtypes alike. Either way each part's rows are contiguous in every leaf,
    so a writer of one part writes memory no other part touches.

    Examples:
        >>> leaf = {"key": ["obs"], "dtype": "uint8", "shape": [2, 3], "nbytes": 6}
        >>> part = {"batch_size": [2], "names": None, "leaves": [leaf], "subs": []}
        >>> layout, where = combined_layout([part, part], stack=True)
        >>> layout["leaves"][0]["shape"], where
        ([2, 2, 3], [0, 1])
        >>> layout, where = combined_layout([part, part], stack=False)
        >>> layout["batch_size"], where
        ([4], [[0, 2], [2, 4]])
    """
    if not parts or any(not layout["batch_size"] for layout in parts):
        return None
    if any(_resized(p, None, stack=stack) != _resized(parts[0], None, stack=stack) for p in parts):
        return None
    if stack:
        return _resized(parts[0], len(parts), stack=True), list(range(len(parts)))
    rows = [int(p["batch_size"][0]) for p in parts]
    bounds = [[sum(rows[:i]), sum(rows[: i + 1])] for i in range(len(rows))]
    combined = _resized(parts[0], sum(rows), stack=False)
    return combined, bounds


def part_of(td: TensorDictBase, part: object) -> TensorDictBase:
    """The views of ``td`` that one part of :func:`combined_layout` is: ``td[i]`` or ``td[start:stop]``.

    Raises:
        ProtocolError: ``part`` is neither an index nor rows of ``td``'s first dim.
    """
    size = td.batch_size[0] if td.batch_dims else 0
    if type(part) is int and 0 <= part < size:
        return td[part]
    if (
        isinstance(part, list)
        and len(part) == 2
        and all(type(x) is int for x in part)
        and 0 <= part[0] < part[1] <= size
    ):
        return td[part[0] : part[1]]
    raise _fail(f"part {part!r:.100} is neither an index nor rows [start, stop) of a batch of {size}")
