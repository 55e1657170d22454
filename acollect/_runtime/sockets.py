"""What both ends of a ZeroMQ connection share: argument checks, socket options, and the bound ROUTER.

The collector's :class:`~acollect._runtime.endpoint.Endpoint` and the workers'
:class:`~acollect._runtime.worker_socket.WorkerSocket` are configured alike
(high-water marks, ZeroMQ heartbeats, a bound on message size), so a peer that
vanishes is noticed the same way from either side. The endpoint and the inference
server's :class:`~acollect._runtime.server_socket.ServerSocket` are both a
:class:`BoundRouter`: a ROUTER bound in a context of its own, a CURVE server when given keys.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import zmq

from acollect._runtime.auth import AllowList, ClientKeys, ServerKeys
from acollect.errors import ConfigurationError, TransportError

__all__ = [
    "BoundRouter",
    "RefusalMonitor",
    "ZmqResources",
    "check_address",
    "check_options",
    "check_positive_int",
    "check_timeout",
    "configure",
    "features",
    "has_message",
    "recv_frames",
]

# Linux's sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
_MAX_IPC_PATH = 107


def check_timeout(timeout: object, name: str = "timeout") -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0 or math.isinf(timeout):
        raise ConfigurationError.bad_value(name, timeout, "a finite number of seconds >= 0")
    return float(timeout)


def check_positive_int(value: object, name: str) -> int:
    if type(value) is not int or value < 1:
        raise ConfigurationError.bad_value(name, value, "an int >= 1")
    return value


def check_address(address: object) -> str:
    if not isinstance(address, str) or not address.startswith(("ipc://", "tcp://")):
        raise ConfigurationError.bad_value("address", address, "'ipc://<path>' or 'tcp://<host>:<port>'")
    if address.startswith("ipc://") and len(os.fsencode(address[len("ipc://") :])) > _MAX_IPC_PATH:
        raise ConfigurationError.bad_value("address", address, f"an ipc path of at most {_MAX_IPC_PATH} bytes")
    return address


def configure(
    sock: zmq.Socket[Any], *, hwm: int, heartbeat_ivl: float, heartbeat_timeout: float, max_message_bytes: int | None
) -> None:
    sock.setsockopt(zmq.LINGER, 0)  # close() never waits for unsent data of a dead peer
    sock.setsockopt(zmq.SNDHWM, hwm)  # credits bound the batches in flight; HWM bounds the rest
    sock.setsockopt(zmq.RCVHWM, hwm)
    # ZMTP pings notice a peer that vanished without closing its TCP connection.
    sock.setsockopt(zmq.HEARTBEAT_IVL, round(heartbeat_ivl * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, round(heartbeat_timeout * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TTL, round(heartbeat_timeout * 1000))
    if max_message_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)


#: the socket monitor events of a refused handshake (a key not on the allow-list, no CURVE, a wrong server key)
REFUSED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class RefusalMonitor:
    """Counts the handshakes a keyed (CURVE server) socket refused, from its socket monitor.

    Handshake failures never reach the ZAP handler when a peer speaks no CURVE or has the wrong server key;
    the socket monitor sees those too. A PAIR socket in the same context reads it, without the event loop.
    Call :meth:`close` from the thread that owns ``sock``, before closing it; :attr:`count` may be read from
    any thread (a lock keeps it apart from :meth:`close`).
    """

    def __init__(self, ctx: zmq.Context[Any], sock: zmq.Socket[Any], name: str) -> None:
        address = f"inproc://acollect-monitor-{name}-{id(self)}"
        sock.monitor(address, REFUSED_EVENTS)
        self._monitored: zmq.Socket[Any] | None = sock
        self._pair: zmq.Socket[Any] | None = ctx.socket(zmq.PAIR)
        self._pair.setsockopt(zmq.LINGER, 0)
        self._pair.connect(address)
        self._count = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Refused handshakes so far (each attempt of a peer that keeps retrying counts); kept after close."""
        with self._lock:
            pair = self._pair
            if pair is not None:
                try:
                    while True:
                        pair.recv_multipart(zmq.NOBLOCK)
                        self._count += 1
                except zmq.Again:
                    pass
                except zmq.ZMQError:
                    pass  # closed meanwhile: the count so far stands
            return self._count

    def close(self) -> None:
        """Stops monitoring (idempotent); the count stays readable."""
        _ = self.count
        with self._lock:
            pair, self._pair = self._pair, None
            sock, self._monitored = self._monitored, None
            if sock is not None and not sock.closed:
                sock.disable_monitor()
            if pair is not None:
                pair.close(linger=0)


# Plain ints: pyzmq's enum flags cost more than the call itself on the trainer's path of every batch.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)


def has_message(sock: zmq.Socket[Any]) -> bool:
    return bool(int(sock.get(_EVENTS)) & _POLLIN)


def recv_frames(sock: zmq.Socket[Any]) -> list[zmq.Frame]:
    """The next message's frames, without waiting (``zmq.Again`` if none), not copied.

    ``recv_multipart`` asks the socket for ``RCVMORE`` after each frame, through an enum; each frame
    knows it already (``Frame.more``), and a message arrives whole, so the later parts never wait.
    """
    frame = sock.recv(_NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(_NOBLOCK, copy=False)
        frames.append(frame)
    return frames


def check_options(hwm: int, heartbeat_ivl: float, heartbeat_timeout: float, max_message_bytes: int | None) -> None:
    check_positive_int(hwm, "hwm")
    check_timeout(heartbeat_ivl, "heartbeat_ivl")
    check_timeout(heartbeat_timeout, "heartbeat_timeout")
    if max_message_bytes is not None:
        check_positive_int(max_message_bytes, "max_message_bytes")


def features() -> dict[str, Any]:
    """What the ZeroMQ library here supports: ``ipc`` sockets, ``curve`` encryption, and its ``libzmq`` version.

    Examples:
        >>> sorted(features())
        ['curve', 'ipc', 'libzmq']
    """
    return {"ipc": bool(zmq.has("ipc")), "curve": bool(zmq.has("curve")), "libzmq": zmq.zmq_version()}


class ZmqResources:
    """One owner's ZeroMQ context and what was opened in it, released together by :meth:`close`, or when the
    owner is garbage collected unclosed.

    pyzmq's finalizers cannot be left to do it: when a socket and its context become garbage together (in a
    reference cycle, as a collector dropped without shutdown is), the context's finalizer may run first,
    find the socket still open and wait in ``zmq_ctx_term`` for it forever. Here a ``weakref.finalize`` of
    the owner holds the context and its sockets, so they stay reachable until it closes them, sockets first
    (``linger=0``: nothing waits for a peer), then the context. Nothing in it blocks.

    Args:
        owner: the object whose life the resources follow (never referenced from here).

    Examples:
        >>> class Owner:
        ...     def __init__(self):
        ...         self.zmq = ZmqResources(self)
        ...         self.sock = self.zmq.socket(zmq.ROUTER)
        ...         self.me = self  # a reference cycle: only the cyclic garbage collector frees it
        >>> import gc
        >>> owner = Owner(); sock = owner.sock; del owner
        >>> _ = gc.collect()
        >>> sock.closed
        True
    """

    def __init__(self, owner: object) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self._sockets: list[zmq.Socket[Any]] = []
        self._before: list[Callable[[], None]] = []  # run before the sockets close (a socket monitor's end)
        self._after: list[Callable[[], None]] = []  # run once the context is gone (files to remove)
        self._finalizer = weakref.finalize(owner, self._release)

    def socket(self, kind: int) -> zmq.Socket[Any]:
        """A new socket of ``kind`` in the context, closed with it (``LINGER`` 0)."""
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self._sockets.append(sock)
        return sock

    def on_close(self, release: Callable[[], None], *, after: bool = False) -> None:
        """Calls ``release`` at :meth:`close`: before the sockets close, or (``after``) once the context is gone.

        ``release`` must not reference the owner (it would never be garbage collected).
        """
        (self._after if after else self._before).append(release)

    @property
    def closed(self) -> bool:
        """Whether the resources were released."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Releases everything now (idempotent)."""
        self._finalizer()

    def _release(self) -> None:
        for release in reversed(self._before):  # the last opened (a monitor on a socket) ends first
            with contextlib.suppress(Exception):
                release()
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        self.ctx.destroy(linger=0)  # term(), after closing any socket opened in it some other way
        for release in self._after:
            with contextlib.suppress(Exception):
                release()
        self._before.clear()
        self._after.clear()


class BoundRouter:
    """A ROUTER socket bound in a ZeroMQ context of its own, a CURVE server when given keys.

    What the collector's :class:`~acollect._runtime.endpoint.Endpoint` and the inference server's
    :class:`~acollect._runtime.server_socket.ServerSocket` share. A subclass says how its ``address``
    argument becomes the address bound (:meth:`_resolve`), what a failed bind raises (:meth:`_bind_error`),
    and what its errors call it (:attr:`_noun`, :attr:`_closed_message`). Keys encrypt every connection and
    let in only the peers whose public key is in ``keys.authorized_dir`` or comes from
    :meth:`local_client_keys`; the refused handshakes are counted in :attr:`rejected_connections`.

    Args:
        address: the subclass's address argument, for :meth:`_resolve`.
        keys: the server's key pair and allow-list, or ``None``.
        hwm, heartbeat_ivl, heartbeat_timeout, max_message_bytes: the options :func:`configure` sets.
        mandatory: a send to a peer that is not connected raises instead of being dropped silently
            (``ROUTER_MANDATORY``), and a peer that reconnects with an identity takes it back (``ROUTER_HANDOVER``).

    Raises:
        ConfigurationError: ``keys`` is not a ``ServerKeys``, or :meth:`_resolve` refused ``address``.
        Exception: what :meth:`_bind_error` makes of a ZeroMQ error while binding.
    """

    #: what ``local_client_keys()`` calls it when it refuses ("endpoint")
    _noun: str
    #: the error's message on a closed socket (``{address}``: where it was bound)
    _closed_message: str

    def __init__(
        self,
        address: str | None,
        keys: ServerKeys | None,
        *,
        hwm: int,
        heartbeat_ivl: float,
        heartbeat_timeout: float,
        max_message_bytes: int | None = None,
        mandatory: bool = False,
    ) -> None:
        if keys is not None and not isinstance(keys, ServerKeys):
            raise ConfigurationError.bad_value("keys", keys, "None or a ServerKeys (ServerKeys.load(directory))")
        self._address = ""
        self._server_public = b""
        self._allow: AllowList | None = None
        self._monitor: RefusalMonitor | None = None
        self._zmq = ZmqResources(self)
        sock = self._zmq.socket(zmq.ROUTER)
        self._sock: zmq.Socket[Any] | None = sock
        try:
            target = self._resolve(address)  # raises no ZMQError: the handler below has a target
            configure(
                sock,
                hwm=hwm,
                heartbeat_ivl=heartbeat_ivl,
                heartbeat_timeout=heartbeat_timeout,
                max_message_bytes=max_message_bytes,
            )
            if mandatory:
                sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if keys is not None:
                keys.apply(sock)
                self._server_public = keys.public
                self._allow = AllowList(self._zmq.ctx, keys.authorized_dir)
                self._zmq.on_close(self._allow.stop)
                self._monitor = RefusalMonitor(self._zmq.ctx, sock, type(self).__name__)
                self._zmq.on_close(self._monitor.close)  # the count stays readable after close
            sock.bind(target)
            self._address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._zmq.close()  # not close(): a subclass's may need what its __init__ makes after this one
            raise self._bind_error(target, exc) from exc
        except BaseException:
            self._zmq.close()
            raise

    def _resolve(self, address: str | None) -> str:
        """The address to bind for the ``address`` argument, checked (:func:`check_address`)."""
        raise NotImplementedError

    def _bind_error(self, address: str, exc: zmq.ZMQError) -> Exception:
        """The error to raise when binding ``address`` (as :meth:`_resolve` gave it) failed with ``exc``."""
        raise NotImplementedError

    def _private_ipc(self, prefix: str, name: str) -> str:
        """An ipc address named ``name`` in a fresh private temporary directory, removed on close."""
        directory = tempfile.mkdtemp(prefix=prefix)
        self._zmq.on_close(partial(shutil.rmtree, directory, ignore_errors=True), after=True)
        return f"ipc://{directory}/{name}"

    @property
    def address(self) -> str:
        """Where peers connect: the bound address, with the real path or port where one was picked."""
        return self._address

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._sock is None

    @property
    def secure(self) -> bool:
        """Whether this socket encrypts and authenticates with CURVE keys."""
        return self._allow is not None

    @property
    def rejected_connections(self) -> int:
        """Connection attempts refused so far: keys not on the allow-list, peers without CURVE or with a wrong
        server key (a peer that keeps retrying counts once per attempt). Readable after close, from any thread."""
        return self._monitor.count if self._monitor is not None else 0

    @property
    def rejected_keys(self) -> dict[str, int]:
        """Public keys (z85) refused by the allow-list and how often each was."""
        return self._allow.rejected_keys if self._allow is not None else {}

    def local_client_keys(self) -> ClientKeys:
        """A fresh key pair this socket accepts, for peers its owner starts itself (handed over privately).

        Raises:
            TransportError: the socket has no keys, or is closed.
        """
        if self._allow is None or self._sock is None:
            raise TransportError(f"local_client_keys() needs an open {self._noun} with keys")
        keys = ClientKeys.fresh(self._server_public)
        self._allow.allow(keys.public)
        return keys

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            raise TransportError(self._closed_message.format(address=self._address))
        return self._sock

    def close(self) -> None:
        """Closes the socket (what it queued is dropped) and its context, and removes a private ipc directory.

        Idempotent.
        """
        self._sock = None
        self._zmq.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._address!r}{', closed' if self.closed else ''})"
