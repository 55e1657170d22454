"""What both ends of a ZeroMQ connection share: argument checks and socket options.

The collector's :class:`~acollect._runtime.endpoint.Endpoint` and the workers'
:class:`~acollect._runtime.worker_socket.WorkerSocket` are configured alike
(high-water marks, ZeroMQ heartbeats, a bound on message size), so a peer that
vanishes is noticed the same way from either side.
"""

from __future__ import annotations

import contextlib
import math
import os
import weakref
from collections.abc import Callable
from typing import Any

import zmq

from acollect.errors import ConfigurationError

__all__ = [
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


def check_address(address: str) -> str:
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
    any one thread at a time (the caller serialises it with :meth:`close`).
    """

    def __init__(self, ctx: zmq.Context[Any], sock: zmq.Socket[Any], name: str) -> None:
        address = f"inproc://acollect-monitor-{name}-{id(self)}"
        sock.monitor(address, REFUSED_EVENTS)
        self._monitored: zmq.Socket[Any] | None = sock
        self._pair: zmq.Socket[Any] | None = ctx.socket(zmq.PAIR)
        self._pair.setsockopt(zmq.LINGER, 0)
        self._pair.connect(address)
        self._count = 0

    @property
    def count(self) -> int:
        """Refused handshakes so far (each attempt of a peer that keeps retrying counts); kept after close."""
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
        if self._pair is None:
            return
        _ = self.count
        sock, self._monitored = self._monitored, None
        if sock is not None and not sock.closed:
            sock.disable_monitor()
        self._pair.close(linger=0)
        self._pair = None


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
