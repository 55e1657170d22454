"""The control channel between a trainer and its inference server process: framed msgpack on a socket pair.

Only what is not per step travels here: the server's hello (its address, its policy's weight structure and
device), weight-update commands (the weights themselves are in shared memory), batch-size changes, ``infer()`` calls
from the trainer's own tasks, and the server's last word when it fails (``"policy"``: whether the failure was its
policy's, which the trainer raises as an :class:`~acollect.errors.InferencePolicyError`). The env workers' steps
never do: they reach the server process directly (shared-memory slots, or ZeroMQ messages from other hosts).

A message is a 4-byte little-endian length and a msgpack map with a ``"k"`` (kind). Tensors go as
``[key parts, dtype name, shape, raw bytes]``. Both ends are this library, in two processes of one user, on a
socket pair nobody else holds: still, nothing is unpickled, and a malformed message is a
:class:`~acollect.errors.ProtocolError`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Mapping
from typing import Any

import msgpack
import torch

from acollect.errors import ProtocolError, TransportError

__all__ = ["FrameReader", "configure", "pack", "read_available", "send", "tensors_from_wire", "tensors_to_wire"]

_LENGTH = struct.Struct("<I")
_MAX_MESSAGE = 1 << 31
_BUFFER = 4 << 20  # socket buffers: an answer to the trainer never waits on a busy event loop

Key = tuple[str, ...]


def pack(message: Mapping[str, Any]) -> bytes:
    """One framed message.

    Examples:
        >>> reader = FrameReader()
        >>> reader.feed(pack({"k": "ping", "n": 1}) + pack({"k": "stop"}))
        >>> reader.messages()
        [{'k': 'ping', 'n': 1}, {'k': 'stop'}]
    """
    body = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into messages (bytes fed in any pieces)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def messages(self) -> list[dict[str, Any]]:
        """The whole messages received so far, in order.

        Raises:
            ProtocolError: a message is not a msgpack map with a ``"k"``.
        """
        out = []
        buffer = self._buffer
        while len(buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer)
            if size > _MAX_MESSAGE:
                raise ProtocolError(f"a control message of {size} bytes")
            if len(buffer) < _LENGTH.size + size:
                break
            body = bytes(buffer[_LENGTH.size : _LENGTH.size + size])
            del buffer[: _LENGTH.size + size]
            try:
                message = msgpack.unpackb(body, raw=False, strict_map_key=True, max_ext_len=0)
            except Exception as exc:
                raise ProtocolError(f"a malformed control message ({type(exc).__name__}: {exc})") from exc
            if not isinstance(message, dict) or not isinstance(message.get("k"), str):
                raise ProtocolError(f"a control message is a map with a kind 'k', got {message!r:.100}")
            out.append(message)
        return out


def configure(sock: socket.socket) -> None:
    """Large buffers both ways, blocking writes (small messages), reads with ``MSG_DONTWAIT``."""
    with contextlib.suppress(OSError):  # the system's limit applies
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
    sock.setblocking(True)


def send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    """Sends one message whole (blocking).

    Raises:
        TransportError: the other end is gone.
    """
    try:
        sock.sendall(pack(message))
    except OSError as exc:
        raise TransportError(f"the control channel is closed: {exc}") from exc


def read_available(sock: socket.socket, reader: FrameReader) -> bool:
    """Feeds ``reader`` whatever ``sock`` holds now, without waiting; ``False`` once the other end closed."""
    while True:
        try:
            data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        reader.feed(data)
        if len(data) < 1 << 20:
            return True


def tensors_to_wire(leaves: Mapping[Key, torch.Tensor]) -> list[list[Any]]:
    """``{key: tensor}`` as msgpack-able entries (CPU, contiguous bytes)."""
    out = []
    for key, value in leaves.items():
        tensor = value.detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        out.append([list(key), str(tensor.dtype).removeprefix("torch."), list(tensor.shape), raw])
    return out


def tensors_from_wire(entries: object) -> dict[Key, torch.Tensor]:
    """Reads what :func:`tensors_to_wire` wrote.

    Raises:
        ProtocolError: an entry is malformed, or its bytes do not fit its dtype and shape.
    """
    if not isinstance(entries, list):
        raise ProtocolError(f"tensors are a list of entries, got {type(entries).__name__}")
    out: dict[Key, torch.Tensor] = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 4):
            raise ProtocolError(f"a tensor entry is [key, dtype, shape, bytes], got {entry!r:.100}")
        key, dtype_name, shape, raw = entry
        dtype = getattr(torch, dtype_name, None) if isinstance(dtype_name, str) else None
        if not (isinstance(key, list) and key and all(isinstance(k, str) for k in key)):
            raise ProtocolError(f"a tensor key is a non-empty list of str, got {key!r:.100}")
        if not isinstance(dtype, torch.dtype) or not isinstance(raw, bytes):
            raise ProtocolError(f"tensor {key}: dtype {dtype_name!r:.40} or its bytes are malformed")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ProtocolError(f"tensor {key}: shape {shape!r:.100} is not a list of ints >= 0")
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(raw) != numel * itemsize:
            raise ProtocolError(f"tensor {key}: {len(raw)} bytes for {dtype_name} {shape}")
        flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[tuple(key)] = flat.reshape(shape)
    return out
