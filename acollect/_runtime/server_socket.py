"""A server thread's side of ZeroMQ: a blocking ROUTER socket, and a wait on it and other descriptors.

The inference server (:mod:`acollect.inference`) answers worker processes' per-step requests from
a thread of its own, so its socket is a plain synchronous one, like a worker's
(:class:`~acollect._runtime.worker_socket.WorkerSocket`), and never awaited. Every call on it is
non-blocking; the thread blocks only in :meth:`Waiter.wait`, which polls the socket together with
the descriptors that wake the thread (a socket pair from the event loop), with a timeout.

This is a per-step path: a call here adds one Python call to ZeroMQ's own, and nothing else (no
encoding, no allocation beyond ZeroMQ's frames). ZeroMQ errors become
:class:`~acollect.errors.TransportError` here, at the boundary, and a bind that fails a
:class:`~acollect.errors.ConfigurationError` naming the address.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from acollect._runtime.auth import ServerKeys
from acollect._runtime.sockets import BoundRouter, check_address, recv_frames
from acollect.errors import ConfigurationError, TransportError

__all__ = ["Ready", "ServerSocket", "Waiter"]


class ServerSocket(BoundRouter):
    """A ROUTER socket bound for a server thread: clients (DEALER sockets) send requests, it answers each.

    Args:
        address: ``"ipc"`` (a private path in a temporary directory, removed on close), ``"ipc://<path>"``,
            ``"tcp://<host>"`` (a free port) or ``"tcp://<host>:<port>"``.
        hwm: the most messages queued per client in each direction.
        heartbeat_ivl: seconds between ZMTP heartbeats.
        heartbeat_timeout: seconds without traffic before ZeroMQ drops a connection.
        keys: make this a CURVE server, as a collector's endpoint with keys: every connection is encrypted,
            and only clients whose public key is in ``keys.authorized_dir`` (or given by
            :meth:`local_client_keys`) get in. Refused handshakes are counted in :attr:`rejected_connections`.

    Raises:
        ConfigurationError: ``address`` is malformed or this process cannot bind it, or ``keys`` is not a
            ``ServerKeys``.

    Examples:
        >>> from acollect._runtime.worker_socket import WorkerSocket
        >>> server = ServerSocket("tcp://127.0.0.1")
        >>> client = WorkerSocket(server.address, b"c0")
        >>> client.send([b"ping"], timeout=5)
        >>> Waiter([], server).wait(5000).socket
        True
        >>> route, frames = server.recv_nowait()
        >>> route, [bytes(f) for f in frames]
        (b'c0', [b'ping'])
        >>> server.send_nowait(route, [b"pong"], copy=True)
        True
        >>> [bytes(f) for f in client.recv(timeout=5)]
        [b'pong']
        >>> client.close()
        >>> server.close()
    """

    _noun = "server socket"
    _closed_message = "the server socket at {address} is closed"

    def __init__(
        self,
        address: str,
        *,
        hwm: int = 1024,
        heartbeat_ivl: float = 1.0,
        heartbeat_timeout: float = 10.0,
        keys: ServerKeys | None = None,
    ) -> None:
        super().__init__(address, keys, hwm=hwm, heartbeat_ivl=heartbeat_ivl, heartbeat_timeout=heartbeat_timeout)

    def _resolve(self, address: str | None) -> str:
        if address == "ipc":
            address = self._private_ipc("acollect-server-", "server.sock")
        elif isinstance(address, str) and address.startswith("tcp://") and address.count(":") == 1:
            address += ":0"
        return check_address(address)

    def _bind_error(self, address: str, exc: zmq.ZMQError) -> Exception:
        return ConfigurationError.bad_value("address", address, f"an address this process can bind ({exc})")

    def allow(self, public: bytes) -> None:
        """Accepts the client holding the secret half of ``public`` from now on (an in-memory allow-list entry).

        Raises:
            TransportError: the socket has no keys, or is closed.
        """
        if self._allow is None or self._sock is None:
            raise TransportError("allow() needs an open server socket with keys")
        self._allow.allow(public)

    def recv_nowait(self) -> tuple[bytes, list[zmq.Frame]] | None:
        """The next request, as the client's route and its frames (not copied), or ``None`` if none waits.

        Raises:
            TransportError: the socket is closed or ZeroMQ failed.
        """
        try:
            frames = recv_frames(self._socket())
        except zmq.Again:
            return None
        except zmq.ZMQError as exc:
            raise TransportError(f"receiving on {self._address} failed: {exc}") from exc
        return frames[0].bytes, frames[1:]

    def send_nowait(self, route: bytes, frames: Sequence[Any], *, copy: bool) -> bool:
        """Sends ``frames`` to the client ``route``; ``False`` if ZeroMQ could not take them now.

        A client that vanished, or whose queue is full, loses its answer: a ROUTER drops it (a client
        that gave up on a request recognises a late answer anyway).

        Args:
            route: the route :meth:`recv_nowait` gave with the request.
            frames: bytes-like frames.
            copy: let ZeroMQ copy the frames (cheaper for small ones) rather than hold on to the buffers.

        Raises:
            TransportError: the socket is closed or ZeroMQ failed.
        """
        try:
            self._socket().send_multipart([route, *frames], zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            raise TransportError(f"answering {route!r} on {self._address} failed: {exc}") from exc
        return True

    def __enter__(self) -> ServerSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class Ready:
    """What a :meth:`Waiter.wait` found readable: descriptors, and whether the server socket holds a request."""

    fds: frozenset[int] = frozenset()
    socket: bool = False

    def __bool__(self) -> bool:
        return bool(self.fds) or self.socket


class Waiter:
    """Blocks a thread until one of some descriptors, or a :class:`ServerSocket`, has something to read.

    Args:
        fds: file descriptors to watch (e.g. the reading end of a wake-up socket pair).
        sock: a server socket to watch as well (``None``: the descriptors only).
    """

    def __init__(self, fds: Sequence[int], sock: ServerSocket | None = None) -> None:
        self._poller = zmq.Poller()
        for fd in fds:
            self._poller.register(fd, zmq.POLLIN)
        self._zmq: zmq.Socket[Any] | None = None
        if sock is not None:
            self._zmq = sock._socket()
            self._poller.register(self._zmq, zmq.POLLIN)

    def watch(self, added: Sequence[int], removed: Sequence[int]) -> None:
        """Starts watching the descriptors ``added`` and stops watching ``removed`` (connections that come and go)."""
        for fd in removed:
            with contextlib.suppress(KeyError):
                self._poller.unregister(fd)
        for fd in added:
            self._poller.register(fd, zmq.POLLIN)

    def wait(self, timeout_ms: int) -> Ready:
        """Waits up to ``timeout_ms`` milliseconds; returns what became readable (falsy: nothing).

        Its caller reads only those: a read that finds nothing costs a system call and an exception each.

        Raises:
            TransportError: ZeroMQ failed (a watched socket was closed under the wait).
        """
        try:
            events = self._poller.poll(timeout_ms)
        except zmq.ZMQError as exc:
            raise TransportError(f"waiting on the server's sockets failed: {exc}") from exc
        if not events:
            return _NOTHING
        return Ready(frozenset(fd for fd, _ in events if isinstance(fd, int)), any(fd is self._zmq for fd, _ in events))


_NOTHING = Ready()
