"""The worker's side of a ZeroMQ connection: a blocking DEALER socket.

Worker processes run plain synchronous code; every call takes a timeout, and
ZeroMQ errors become :class:`~acollect.errors.TransportError` here, at the boundary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import zmq

from acollect._runtime.auth import ClientKeys
from acollect._runtime.sockets import (
    ZmqResources,
    check_address,
    check_options,
    check_timeout,
    configure,
    recv_frames,
)
from acollect.errors import ConfigurationError, TransportError

__all__ = ["WorkerSocket"]


class WorkerSocket:
    """A worker's side: a blocking DEALER socket connected to an :class:`Endpoint`.

    Plain synchronous code for worker processes; every call takes a timeout.

    Args:
        address: the endpoint's :attr:`Endpoint.address`.
        identity: the name the endpoint sees this worker as (non-empty bytes, at most
            255, not starting with a zero byte).
        hwm, heartbeat_ivl, heartbeat_timeout, max_message_bytes: as for :class:`Endpoint`.
        keys: connect as a CURVE client with this key pair, to a collector that must hold the
            secret half of ``keys.server_public``.

    Raises:
        ConfigurationError: a bad argument.
        TransportError: ZeroMQ failed to connect.
    """

    def __init__(
        self,
        address: str,
        identity: bytes,
        *,
        hwm: int = 64,
        heartbeat_ivl: float = 1.0,
        heartbeat_timeout: float = 10.0,
        max_message_bytes: int | None = None,
        keys: ClientKeys | None = None,
    ) -> None:
        address = check_address(address)
        if keys is not None and not isinstance(keys, ClientKeys):
            raise ConfigurationError.bad_value("keys", keys, "None or a ClientKeys (ClientKeys.load(directory, name))")
        if not isinstance(identity, bytes) or not 0 < len(identity) <= 255 or identity[0] == 0:
            raise ConfigurationError.bad_value("identity", identity, "1 to 255 bytes, not starting with b'\\x00'")
        check_options(hwm, heartbeat_ivl, heartbeat_timeout, max_message_bytes)
        self._address = address
        self._identity = identity
        self._zmq = ZmqResources(self)
        self._sock: zmq.Socket[Any] | None = self._zmq.socket(zmq.DEALER)
        try:
            configure(
                self._sock,
                hwm=hwm,
                heartbeat_ivl=heartbeat_ivl,
                heartbeat_timeout=heartbeat_timeout,
                max_message_bytes=max_message_bytes,
            )
            self._sock.setsockopt(zmq.ROUTING_ID, identity)
            # Queue only to a finished connection: a send before the collector is
            # reachable waits (and times out) instead of piling up.
            self._sock.setsockopt(zmq.IMMEDIATE, 1)
            if keys is not None:
                keys.apply(self._sock)
            self._sock.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise TransportError(f"cannot connect to {address}: {exc}") from exc

    @property
    def identity(self) -> bytes:
        """This worker's identity."""
        return self._identity

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._sock is None

    @property
    def connected(self) -> bool:
        """Whether a connection to the endpoint is up and can take a message now.

        Messages queue only to a finished connection (``IMMEDIATE``), so this is false while
        the endpoint is unreachable: its process ended, it closed, or ZeroMQ's own heartbeats
        went unanswered (``heartbeat_timeout``). It is also false, in theory, while this
        socket's queue to a live endpoint is full.

        Raises:
            TransportError: the socket is closed or ZeroMQ failed.
        """
        try:
            return bool(self._socket().poll(0, zmq.POLLOUT))
        except zmq.ZMQError as exc:
            raise TransportError(f"polling {self._address} failed: {exc}") from exc

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            raise TransportError("the worker socket is closed")
        return self._sock

    def send(
        self, frames: Sequence[Any], *, timeout: float = 10.0, copy: bool = False, track: bool = False
    ) -> zmq.MessageTracker | None:
        """Sends one message to the endpoint.

        Args:
            frames: bytes-like frames.
            timeout: seconds to wait until the endpoint can take the message.
            copy: copy every frame now (then the buffers may be reused at once).
            track: return a tracker whose ``done`` says when ZeroMQ released the buffers.

        Raises:
            TimeoutError: the endpoint did not take the message within ``timeout``.
            TransportError: the socket is closed or ZeroMQ failed.
        """
        timeout = check_timeout(timeout)
        sock = self._socket()
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                if sock.poll(math.ceil(remaining * 1000), zmq.POLLOUT):
                    try:
                        tracker = sock.send_multipart(frames, zmq.NOBLOCK, copy=copy, track=track)
                    except zmq.Again:
                        continue
                    return tracker if track else None
                if remaining <= 0:
                    raise TimeoutError(f"{self._address} did not take a message within {timeout}s")
        except zmq.ZMQError as exc:
            raise TransportError(f"sending to {self._address} failed: {exc}") from exc

    def recv(self, timeout: float) -> list[zmq.Frame] | None:
        """Waits up to ``timeout`` seconds for a message; ``None`` if none came.

        Raises:
            TransportError: the socket is closed or ZeroMQ failed.
        """
        timeout = check_timeout(timeout)
        sock = self._socket()
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                if sock.poll(math.ceil(remaining * 1000), zmq.POLLIN):
                    try:
                        return recv_frames(sock)
                    except zmq.Again:
                        continue
                if remaining <= 0:
                    return None
        except zmq.ZMQError as exc:
            raise TransportError(f"receiving from {self._address} failed: {exc}") from exc

    def close(self) -> None:
        """Closes the socket and its context (idempotent)."""
        self._sock = None
        self._zmq.close()

    def __enter__(self) -> WorkerSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WorkerSocket({self._address!r}, identity={self._identity!r}{', closed' if self.closed else ''})"
