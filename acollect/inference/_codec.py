"""The per-step messages of central inference, encoded for speed.

A step's request (observations) and reply (actions) are small and go out hundreds of times a second
per worker, always with the same keys, shapes and dtypes. So a message is three parts:

* a tiny msgpack head: ``[protocol version, kind, seq, policy version]``;
* the **layout** (what :func:`acollect._runtime.wire.encode_tensordict` describes: keys, dtypes,
  shapes), as msgpack bytes that the sender packs once and the receiver validates once, then finds
  again by its bytes;
* one raw frame per tensor, never pickled.

The receiver checks every frame's size against the validated layout, as for batches.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._runtime.layout import LeafLayout, TensorDictLayout, validate_layout
from acollect._runtime.wire import PROTOCOL_VERSION, byte_view, encode_tensordict
from acollect.errors import ProtocolError

__all__ = ["Decoded", "LayoutCache", "encode", "leaves_of"]

Key = tuple[str, ...]

_MAX_LAYOUTS = 64  # distinct layouts kept per receiver (a peer sending endless new ones costs a bounded cache)
_MAX_HEAD_BYTES = 256
# Tensors smaller than this in all travel as one frame (their bytes one after the other): each frame costs
# ZeroMQ more than copying a few kilobytes.
_ONE_FRAME_BYTES = 64 * 1024


def leaves_of(td: TensorDictBase) -> dict[Key, torch.Tensor]:
    """The leaves of ``td`` by tuple key (nested keys flattened)."""
    out: dict[Key, torch.Tensor] = {}
    for key, value in td.items(include_nested=True, leaves_only=True):
        assert isinstance(value, torch.Tensor)
        out[(key,) if isinstance(key, str) else tuple(key)] = value
    return out


class Encoder:
    """Encodes messages whose tensors keep one structure, packing the layout only when it changes."""

    def __init__(self) -> None:
        self._signature: tuple[Any, ...] | None = None
        self._layout = b""

    def frames(self, kind: str, seq: int, version: int, rows: int, leaves: Mapping[Key, torch.Tensor]) -> list[Any]:
        """The frames of one message carrying ``leaves`` (each ``[rows, ...]``)."""
        signature = (rows, *((k, v.dtype, v.shape) for k, v in leaves.items()))
        if signature != self._signature:
            td = TensorDict({}, batch_size=[rows])
            for key, value in leaves.items():
                td.set(key, value)
            layout, _ = encode_tensordict(td)
            self._layout = msgpack.packb(layout, use_bin_type=True)
            self._signature = signature
        head = msgpack.packb([PROTOCOL_VERSION, kind, seq, version])
        views = [byte_view(v) for v in leaves.values()]
        if sum(v.nbytes for v in views) < _ONE_FRAME_BYTES:
            return [head, self._layout, b"".join(views)]  # one copy of a few hundred bytes beats a frame per leaf
        return [head, self._layout, *views]


def encode(kind: str, seq: int, version: int, td: TensorDictBase, encoder: Encoder) -> list[Any]:
    """The frames of a message carrying the leaves of ``td``."""
    rows = int(td.batch_size[0]) if td.batch_dims else 1
    return encoder.frames(kind, seq, version, rows, leaves_of(td))


class Decoded:
    """One received message: its kind, numbers, rows and tensors by key."""

    __slots__ = ("kind", "leaves", "rows", "seq", "version")

    def __init__(self, kind: str, seq: int, version: int, rows: int, leaves: dict[Key, torch.Tensor]) -> None:
        self.kind, self.seq, self.version, self.rows, self.leaves = kind, seq, version, rows, leaves


def _fail(reason: str) -> ProtocolError:
    return ProtocolError(f"malformed inference message: {reason}")


def _tensor(frame: Any, leaf: LeafLayout, index: int) -> torch.Tensor:
    view = memoryview(frame)
    if view.nbytes != leaf.nbytes:
        raise _fail(f"frame {index} ({leaf.key!r}) has {view.nbytes} bytes, the layout says {leaf.nbytes}")
    if leaf.nbytes == 0:
        return torch.empty(leaf.shape, dtype=leaf.dtype)
    raw = torch.frombuffer(bytearray(view) if view.readonly else view, dtype=torch.uint8)
    if raw.data_ptr() % leaf.dtype.itemsize:
        raw = raw.clone()  # misaligned frame memory: not every kernel tolerates it
    if leaf.dtype is torch.bool and bool((raw > 1).any()):
        raise _fail(f"bool leaf {leaf.key!r} holds bytes other than 0 and 1")
    return raw.view(leaf.dtype).view(leaf.shape)


class LayoutCache:
    """Validated layouts by their bytes, and the decoding of messages that use them."""

    def __init__(self, kinds: frozenset[str]) -> None:
        self._kinds = kinds
        self._layouts: OrderedDict[bytes, TensorDictLayout] = OrderedDict()

    def _layout(self, frame: Any) -> TensorDictLayout:
        raw = bytes(frame)
        spec = self._layouts.get(raw)
        if spec is None:
            try:
                layout = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
            except Exception as exc:
                raise _fail(f"layout is not valid msgpack ({type(exc).__name__}: {exc})") from exc
            spec = validate_layout(layout)
            if len(spec.batch_size) < 1:
                raise _fail("the tensors must have a leading batch dim")
            self._layouts[raw] = spec
            if len(self._layouts) > _MAX_LAYOUTS:
                self._layouts.popitem(last=False)
        return spec

    def decode(self, frames: Sequence[Any]) -> Decoded:
        """Parses one message (without a routing frame).

        Raises:
            ProtocolError: anything malformed, another protocol version or an unexpected kind.
        """
        if len(frames) < 2:
            raise _fail(f"{len(frames)} frames, expected a head, a layout and tensors")
        head_view = memoryview(frames[0])
        if head_view.nbytes > _MAX_HEAD_BYTES:
            raise _fail(f"a head of {head_view.nbytes} bytes")
        try:
            head = msgpack.unpackb(head_view, raw=False, max_bin_len=0, max_ext_len=0)
            version_, kind, seq, version = head
        except Exception as exc:
            raise _fail(f"head is not [version, kind, seq, policy version] ({exc})") from exc
        if version_ != PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version mismatch: the peer speaks {version_!r:.40}, this side {PROTOCOL_VERSION}"
            )
        if kind not in self._kinds or type(seq) is not int or type(version) is not int:
            raise _fail(
                f"kind {kind!r:.40} (expected one of {sorted(self._kinds)}), seq {seq!r:.40}, version {version!r:.40}"
            )
        spec = self._layout(frames[1])
        parts: Sequence[Any] = frames[2:]
        if len(parts) == 1 and len(spec.leaves) > 1:  # every leaf in one frame, one after the other
            blob = memoryview(parts[0])
            if blob.nbytes != sum(leaf.nbytes for leaf in spec.leaves):
                raise _fail(f"one tensor frame of {blob.nbytes} bytes for leaves of {spec.nbytes} bytes")
            offsets = [0]
            for leaf in spec.leaves:
                offsets.append(offsets[-1] + leaf.nbytes)
            parts = [blob[a:b] for a, b in itertools.pairwise(offsets)]
        if len(parts) != len(spec.leaves):
            raise _fail(f"layout describes {len(spec.leaves)} tensor frames but {len(parts)} arrived")
        leaves = {
            leaf.key: _tensor(f, leaf, i) for i, (leaf, f) in enumerate(zip(spec.leaves, parts, strict=True), start=2)
        }
        return Decoded(kind, seq, version, int(spec.batch_size[0]), leaves)
