"""The versioned wire format: a msgpack header frame followed by raw tensor frames.

A message is a list of frames. Frame 0 is a msgpack map with at least ``"v"``
(the protocol version) and ``"kind"`` (what the message is); frames 1.. are the
raw bytes of the tensors a TensorDict holds, described by the header's ``"td"``
layout. Nothing is ever pickled: a peer can only make the receiver allocate
tensors of whitelisted dtypes and bounded sizes, and every malformed message
raises :class:`~acollect.errors.ProtocolError` with a reason.

The layout those frames follow, and its checks, are :mod:`acollect._runtime.layout`'s.
Weights have their own flat format (:mod:`acollect._weights.sync`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._runtime.layout import (
    ALIGNMENT,
    DEFAULT_MAX_BYTES,
    Key,
    LeafLayout,
    TensorDictLayout,
    _dtype_name,
    _fail,
    aligned_offsets,
    build_tensordict,
    validate_layout,
)
from acollect.errors import ConfigurationError, ProtocolError

# ALIGNMENT, DEFAULT_MAX_BYTES, LeafLayout, TensorDictLayout, aligned_offsets and validate_layout
# are _layout.py's, listed here too because code imports them from this module.
__all__ = [
    "ALIGNMENT",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_HEADER_BYTES",
    "PROTOCOL_VERSION",
    "LeafLayout",
    "TensorDictLayout",
    "aligned_offsets",
    "byte_view",
    "decode_tensordict",
    "encode_tensordict",
    "pack_message",
    "unpack_message",
    "validate_layout",
]

#: Bumped on every incompatible change of the header or frame layout.
PROTOCOL_VERSION = 2  # 2: a worker's hello says its n_envs, no longer its frames_per_batch
#: Default ceiling on the size of the msgpack header frame (1 MiB).
DEFAULT_MAX_HEADER_BYTES = 1 << 20
_RESERVED_FIELDS = frozenset({"v", "kind", "td"})


# --------------------------------------------------------------------------- encoding


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` as a flat memoryview, sharing its memory when it is a contiguous CPU tensor."""
    # A flat uint8 view shares memory with the tensor, so sending it copies nothing;
    # bool and bfloat16 (which numpy cannot hold) travel as their raw bytes too.
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


def _walk(td: TensorDictBase, prefix: Key, leaves: list[tuple[Key, torch.Tensor]], subs: list[dict[str, Any]]) -> None:
    for name, value in td.items():
        key = (*prefix, name)
        if isinstance(value, torch.Tensor):
            leaves.append((key, value))
        elif isinstance(value, TensorDictBase):
            # Sub-TensorDicts with the parent's batch size are rebuilt implicitly; only
            # the others (and empty ones, which no leaf would recreate) are spelled out.
            if value.batch_size != td.batch_size or value.is_empty():
                subs.append({"key": list(key), "batch_size": list(value.batch_size)})
            _walk(value, key, leaves, subs)
        else:
            raise ConfigurationError.bad_value(
                f"td entry {key!r}", type(value).__name__, "a torch.Tensor or a nested TensorDict (no non-tensor data)"
            )


def encode_tensordict(td: TensorDictBase) -> tuple[dict[str, Any], list[memoryview]]:
    """Describes a TensorDict and exposes its leaves as raw byte buffers.

    Contiguous CPU leaves are not copied: each buffer is a memoryview over the
    tensor's own memory (so do not modify the tensors until the buffers are sent).

    Args:
        td: a TensorDict of tensors with wire dtypes; nested TensorDicts allowed.

    Returns:
        ``(layout, buffers)``: a msgpack-able layout and one buffer per leaf.

    Raises:
        ConfigurationError: ``td`` holds non-tensor data or an unsupported dtype.

    Examples:
        >>> td = TensorDict({"obs": torch.zeros(2, 3)}, batch_size=[2])
        >>> layout, buffers = encode_tensordict(td)
        >>> layout["leaves"], [b.nbytes for b in buffers]
        ([{'key': ['obs'], 'dtype': 'float32', 'shape': [2, 3], 'nbytes': 24}], [24])
    """
    if not isinstance(td, TensorDictBase):
        raise ConfigurationError.bad_value("td", type(td).__name__, "a TensorDict")
    found: list[tuple[Key, torch.Tensor]] = []
    subs: list[dict[str, Any]] = []
    _walk(td, (), found, subs)
    leaves, buffers = [], []
    for key, tensor in found:
        buffer = byte_view(tensor)
        leaves.append(
            {
                "key": list(key),
                "dtype": _dtype_name(tensor.dtype, key),
                "shape": list(tensor.shape),
                "nbytes": buffer.nbytes,
            }
        )
        buffers.append(buffer)
    names = list(td.names) if td.batch_dims and any(n is not None for n in td.names) else None
    layout = {"batch_size": list(td.batch_size), "names": names, "leaves": leaves, "subs": subs}
    return layout, buffers


# --------------------------------------------------------------------------- decoding


def _as_bytes_view(frame: object, index: int) -> memoryview:
    try:
        view = memoryview(frame)  # type: ignore[arg-type]
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError) as exc:
        raise _fail(f"frame {index} is not a contiguous bytes-like object ({type(frame).__name__})") from exc


#: Bool leaves up to this size are checked in bytes (a tenth of numpy's cost on a batch's few bytes), bigger in numpy.
_BOOL_CHECK_IN_BYTES = 4096


def _tensor_from(view: memoryview, leaf: LeafLayout, copy: bool) -> torch.Tensor:
    if leaf.nbytes == 0:
        return torch.empty(leaf.shape, dtype=leaf.dtype)
    if leaf.dtype is torch.bool:
        # A bool tensor holding another byte breaks kernels in ways nobody can trace back: a peer's bytes are checked.
        bad = (
            view.tobytes().translate(None, b"\x00\x01")
            if leaf.nbytes <= _BOOL_CHECK_IN_BYTES
            else int(np.frombuffer(view, dtype=np.uint8).max()) > 1
        )
        if bad:
            raise _fail(f"bool leaf {leaf.key!r} holds bytes other than 0 and 1")
    if copy or view.readonly:
        # Read-only buffers (bytes) are copied: torch cannot mark a tensor read-only,
        # and writing through it would corrupt an immutable object.
        raw = torch.empty(leaf.nbytes, dtype=torch.uint8)
        memoryview(raw.numpy())[:] = view  # type: ignore[arg-type]
        return raw.view(leaf.dtype).view(leaf.shape)
    tensor = torch.frombuffer(view, dtype=leaf.dtype)
    if tensor.data_ptr() % leaf.dtype.itemsize:
        tensor = tensor.clone()  # misaligned frame memory: not every kernel tolerates it
    return tensor.view(leaf.shape)


def decode_tensordict(
    layout: object, buffers: Sequence[object], *, copy: bool = False, max_bytes: int = DEFAULT_MAX_BYTES
) -> TensorDict:
    """Rebuilds a TensorDict from a layout and its raw buffers.

    Args:
        layout: the layout :func:`encode_tensordict` produced (received from a peer).
        buffers: one writable bytes-like object per leaf (zmq frames, memoryviews...).
        copy: copy the bytes into fresh tensors. When ``False`` the tensors share memory
            with the buffers and keep them alive; read-only buffers are always copied.
        max_bytes: the most tensor bytes accepted.

    Raises:
        ProtocolError: the layout is malformed or does not match the buffers.

    Examples:
        >>> td = TensorDict({"a": torch.arange(3)}, batch_size=[3])
        >>> layout, buffers = encode_tensordict(td)
        >>> decode_tensordict(layout, [bytearray(b) for b in buffers])["a"]
        tensor([0, 1, 2])
    """
    spec = _validated(layout, max_bytes)
    if len(buffers) != len(spec.leaves):
        raise _fail(f"layout describes {len(spec.leaves)} tensor frames but {len(buffers)} arrived")
    tensors = []
    for index, (leaf, buffer) in enumerate(zip(spec.leaves, buffers, strict=True), start=1):
        view = _as_bytes_view(buffer, index)
        if view.nbytes != leaf.nbytes:
            raise _fail(f"frame {index} ({leaf.key!r}) has {view.nbytes} bytes, the layout says {leaf.nbytes}")
        tensors.append(_tensor_from(view, leaf, copy))
    return build_tensordict(spec, tensors)


def _validated(layout: object, max_bytes: int) -> TensorDictLayout:
    """``validate_layout``, remembered: a worker sends the same layout with every batch, and checking it again costs
    the trainer more than the rest of a small batch's decoding. Keyed by its exact msgpack bytes (what is checked)."""
    try:
        packed = msgpack.packb(layout, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return validate_layout(layout, max_bytes=max_bytes)  # not msgpack-able: nothing to remember, it says why
    return _validated_packed(packed, max_bytes)


@functools.lru_cache(maxsize=64)  # thread-safe; bounded: a peer sending a new layout each time gains nothing
def _validated_packed(packed: bytes, max_bytes: int) -> TensorDictLayout:
    return validate_layout(msgpack.unpackb(packed, raw=False, strict_map_key=True), max_bytes=max_bytes)


# --------------------------------------------------------------------------- messages


def pack_message(
    kind: str, header_fields: Mapping[str, Any] | None = None, td: TensorDictBase | None = None
) -> list[Any]:
    """Builds the frames of one message.

    Args:
        kind: what the message is (e.g. ``"batch"``, ``"weights"``).
        header_fields: extra msgpack-able header entries (not ``"v"``, ``"kind"``, ``"td"``).
        td: an optional TensorDict whose leaves follow as raw frames (not copied).

    Returns:
        ``[header bytes, *tensor buffers]``.

    Examples:
        >>> frames = pack_message("ping", {"seq": 3})
        >>> unpack_message(frames)
        ({'v': 2, 'kind': 'ping', 'seq': 3}, None)
    """
    if not isinstance(kind, str) or not kind:
        raise ConfigurationError.bad_value("kind", kind, "a non-empty str")
    fields = dict(header_fields or {})
    if not all(isinstance(name, str) for name in fields):
        raise ConfigurationError.bad_value("header_fields", fields, "a mapping with str keys (the peer rejects others)")
    clash = _RESERVED_FIELDS & fields.keys()
    if clash:
        raise ConfigurationError.bad_value(
            "header_fields", sorted(clash), f"no reserved field {sorted(_RESERVED_FIELDS)}"
        )
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": kind, **fields}
    buffers: list[memoryview] = []
    if td is not None:
        header["td"], buffers = encode_tensordict(td)
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigurationError.bad_value("header_fields", fields, f"msgpack-able values ({exc})") from exc
    return [packed, *buffers]


def _reject_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def unpack_message(
    frames: Sequence[object],
    *,
    copy: bool = False,
    kinds: frozenset[str] | set[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> tuple[dict[str, Any], TensorDict | None]:
    """Parses and validates the frames of one message.

    Args:
        frames: the received frames (bytes, memoryviews or zmq frames).
        copy: passed to :func:`decode_tensordict`.
        kinds: if given, the only message kinds accepted.
        max_bytes: the most tensor bytes accepted.
        max_header_bytes: the largest header frame accepted.

    Returns:
        ``(header, td)``: the header map (with ``"v"`` and ``"kind"``) and the
        TensorDict, or ``None`` if the message carries none.

    Raises:
        ProtocolError: the message is malformed, of another protocol version or of
            an unexpected kind.

    Examples:
        >>> unpack_message([b"\\x81\\xa1v\\x63"])
        Traceback (most recent call last):
        ...
        acollect.errors.ProtocolError: protocol version mismatch: the peer speaks version 99, this side speaks version 2
    """
    if isinstance(frames, (bytes, bytearray, memoryview, str)) or not isinstance(frames, Sequence) or not frames:
        raise _fail("expected a non-empty list of frames")
    head = _as_bytes_view(frames[0], 0)
    if head.nbytes > max_header_bytes:
        raise _fail(f"header frame has {head.nbytes} bytes, more than the allowed {max_header_bytes}")
    limit = head.nbytes
    try:
        header = msgpack.unpackb(
            head,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            max_str_len=limit,
            max_bin_len=limit,
            max_array_len=limit,
            max_map_len=limit,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises a zoo of types on hostile input
        raise _fail(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(header, dict):
        raise _fail(f"header is a {type(header).__name__}, expected a map")
    version = header.get("v")
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise ProtocolError(
            f"protocol version mismatch: the peer speaks version {version!r:.50}, "
            f"this side speaks version {PROTOCOL_VERSION}"
        )
    kind = header.get("kind")
    if not isinstance(kind, str) or not kind:
        raise _fail(f"header kind={kind!r:.100}, expected a non-empty str")
    if kinds is not None and kind not in kinds:
        raise _fail(f"unexpected message kind {kind!r:.100}, expected one of {sorted(kinds)}")
    layout = header.pop("td", None)
    if layout is None:
        if len(frames) != 1:
            raise _fail(f"a {kind!r} message without tensors arrived with {len(frames) - 1} extra frames")
        return header, None
    return header, decode_tensordict(layout, frames[1:], copy=copy, max_bytes=max_bytes)
