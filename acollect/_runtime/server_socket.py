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
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import zmq

from acollect._runtime.auth import AllowList, ClientKeys, ServerKeys
from acollect._runtime.sockets import RefusalMonitor, ZmqResources, check_address, configure, recv_frames
from acollect.errors import ConfigurationError, TransportError

__all__ = ["Ready", "ServerSocket", "Waiter"]


def _close_monitor(monitor: RefusalMonitor, lock: threading.Lock) -> None:
    with lock:  # the count stays readable
        monitor.close()


class ServerSocket:
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

    def __init__(
        self,
        address: str,
        *,
        hwm: int = 1024,
        heartbeat_ivl: float = 1.0,
        heartbeat_timeout: float = 10.0,
        keys: ServerKeys | None = None,
    ) -> None:
        if keys is not None and not isinstance(keys, ServerKeys):
            raise ConfigurationError.bad_value("keys", keys, "None or a ServerKeys (ServerKeys.load(directory))")
        self._tmpdir: str | None = None
        self._address = address
        self._keys = keys
        self._allow: AllowList | None = None
        self._monitor: RefusalMonitor | None = None
        # The monitor is read by whoever asks for the count (the event loop) and closed by the socket's
        # owner (the server thread): never both at once.
        self._monitor_lock = threading.Lock()
        if address == "ipc":
            self._tmpdir = tempfile.mkdtemp(prefix="acollect-server-")
            address = f"ipc://{self._tmpdir}/server.sock"
        elif isinstance(address, str) and address.startswith("tcp://") and address.count(":") == 1:
            address += ":0"
        self._zmq = ZmqResources(self)
        if self._tmpdir is not None:
            self._zmq.on_close(partial(shutil.rmtree, self._tmpdir, ignore_errors=True), after=True)
        self._ctx: zmq.Context[Any] | None = self._zmq.ctx
        self._sock: zmq.Socket[Any] | None = self._zmq.socket(zmq.ROUTER)
        try:
            address = check_address(address)
            configure(
                self._sock,
                hwm=hwm,
                heartbeat_ivl=heartbeat_ivl,
                heartbeat_timeout=heartbeat_timeout,
                max_message_bytes=None,
            )
            if keys is not None:
                keys.apply(self._sock)
                self._allow = AllowList(self._ctx, keys.authorized_dir)
                self._zmq.on_close(self._allow.stop)
                self._monitor = RefusalMonitor(self._ctx, self._sock, "server")
                self._zmq.on_close(partial(_close_monitor, self._monitor, self._monitor_lock))
            self._sock.bind(address)
            self._address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigurationError.bad_value("address", address, f"an address this process can bind ({exc})") from exc
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        """Where clients connect: the real path, or the port picked."""
        return self._address

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._sock is None

    @property
    def secure(self) -> bool:
        """Whether this socket encrypts and authenticates with CURVE keys."""
        return self._keys is not None

    @property
    def rejected_connections(self) -> int:
        """Connection attempts refused so far: keys not on the allow-list, peers without CURVE or with a wrong
        server key (a peer that keeps retrying counts once per attempt). Readable after close, from any thread."""
        with self._monitor_lock:
            return self._monitor.count if self._monitor is not None else 0

    @property
    def rejected_keys(self) -> dict[str, int]:
        """Public keys (z85) refused by the allow-list and how often each was."""
        return self._allow.rejected_keys if self._allow is not None else {}

    def local_client_keys(self) -> ClientKeys:
        """A fresh key pair this socket accepts, for clients its owner starts itself (handed over privately).

        Raises:
            TransportError: the socket has no keys, or is closed.
        """
        if self._keys is None:
            raise TransportError("local_client_keys() needs an open server socket with keys")
        keys = ClientKeys.fresh(self._keys.public)
        self.allow(keys.public)
        return keys

    def allow(self, public: bytes) -> None:
        """Accepts the client holding the secret half of ``public`` from now on (an in-memory allow-list entry).

        Raises:
            TransportError: the socket has no keys, or is closed.
        """
        if self._allow is None or self._sock is None:
            raise TransportError("allow() needs an open server socket with keys")
        self._allow.allow(public)

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            raise TransportError(f"the server socket at {self._address} is closed")
        return self._sock

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

    def close(self) -> None:
        """Closes the socket (queued answers are dropped) and removes its private ipc directory. Idempotent."""
        self._sock, self._ctx, self._tmpdir = None, None, None
        self._zmq.close()

    def __enter__(self) -> ServerSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ServerSocket({self._address!r}{', closed' if self.closed else ''})"


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
