"""ZeroMQ endpoints: the collector's async ROUTER and the workers' blocking DEALER.

The collector binds one :class:`Endpoint` (a ROUTER awaited through anyio, so under
asyncio and trio alike); each worker process connects one :class:`WorkerSocket` (a
plain, synchronous DEALER whose identity names the worker). Messages are lists of
frames, usually built with :func:`~acollect._runtime.wire.pack_message`.

The endpoint's socket is a plain synchronous one, used only with ``NOBLOCK``; when an
operation cannot complete, the task waits for the socket's ``zmq.FD`` to become
readable (:class:`~acollect._runtime.fd_watch.FdWatch`). That descriptor is edge-triggered: it
signals that the socket's state *changed*, and any call on the socket may consume the
signal. So every operation is tried first, ``zmq.EVENTS`` is checked before waiting,
one task at a time waits on the descriptor while the others wait for it to tell them,
and every wait is bounded by :data:`_POLL_INTERVAL`, so a missed edge costs at most
that much delay, never a hang.

Each endpoint and each worker socket owns its own ZeroMQ context and terminates
it on ``close()``, so closing never waits on, nor leaks, a socket someone else
opened. ZeroMQ errors become :class:`~acollect.errors.TransportError` here, at
the boundary; cancellation passes through untouched.

Frames are sent without a copy where ZeroMQ allows it (big frames): do not modify
a buffer you sent until ZeroMQ is done with it (pass ``track=True`` and wait on
the tracker, or send copies).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from functools import partial
from typing import Any

import anyio
import zmq

from acollect._runtime.auth import ServerKeys
from acollect._runtime.fd_watch import FdWatch
from acollect._runtime.sockets import (
    BoundRouter,
    check_address,
    check_options,
    check_timeout,
    has_message,
    recv_frames,
)

# The blocking side lives in _worker_socket.py; importable from here too, where it always was.
from acollect._runtime.worker_socket import WorkerSocket as WorkerSocket
from acollect.errors import TransportError

__all__ = ["Endpoint", "WorkerSocket"]

# The longest a task waits on the socket's descriptor before it looks at zmq.EVENTS again.
_POLL_INTERVAL = 0.05


def _remove_ipc_file(address: str) -> None:
    """Removes the socket file of a closed ipc endpoint, if it is still a socket file."""
    # libzmq leaves the file behind; a stale one would confuse the next bind's users.
    path = address[len("ipc://") :]
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


class Endpoint(BoundRouter):
    """The collector's side: a ROUTER socket that workers connect to, awaited under asyncio or trio.

    Any number of tasks may send and receive at the same time.

    Args:
        address: ``"ipc://<path>"``, ``"tcp://<host>:<port>"`` (port 0 picks a free
            one) or ``None`` for a fresh ipc path in a private temporary directory,
            removed on close.
        hwm: the most messages queued per peer in each direction.
        heartbeat_ivl: seconds between ZMTP heartbeats.
        heartbeat_timeout: seconds without traffic before ZeroMQ drops a connection.
        max_message_bytes: reject inbound frames larger than this (``None``: no limit).
        keys: make this a CURVE server: every connection is encrypted, and only workers whose
            public key is in ``keys.authorized_dir`` get in (see :mod:`acollect.transport.auth`).
            Refused handshakes are counted in :attr:`rejected_connections`.

    Raises:
        ConfigurationError: a bad argument.
        TransportError: the address cannot be bound.

    Examples:
        >>> import asyncio
        >>> async def main():
        ...     async with Endpoint("tcp://127.0.0.1:0") as endpoint:
        ...         with WorkerSocket(endpoint.address, b"w0") as worker:
        ...             worker.send([b"hello"], timeout=5)
        ...             identity, frames = await endpoint.recv(timeout=5)
        ...             return identity, [bytes(f) for f in frames]
        >>> asyncio.run(main())
        (b'w0', [b'hello'])
        >>> anyio.run(main, backend="trio")
        (b'w0', [b'hello'])
    """

    _noun = "endpoint"
    _closed_message = "the endpoint is closed"

    def __init__(
        self,
        address: str | None = None,
        *,
        hwm: int = 64,
        heartbeat_ivl: float = 1.0,
        heartbeat_timeout: float = 10.0,
        max_message_bytes: int | None = None,
        keys: ServerKeys | None = None,
    ) -> None:
        check_options(hwm, heartbeat_ivl, heartbeat_timeout, max_message_bytes)
        super().__init__(
            address,
            keys,
            hwm=hwm,
            heartbeat_ivl=heartbeat_ivl,
            heartbeat_timeout=heartbeat_timeout,
            max_message_bytes=max_message_bytes,
            mandatory=True,  # a send to a worker not connected raises; a restarted worker takes its identity back
        )
        if self._address.startswith("ipc://"):
            self._zmq.on_close(partial(_remove_ipc_file, self._address), after=True)
        # Tasks in _wait: how many, and the event the others wait on while one watches the descriptor (a fresh one
        # after each time it is set).
        self._waiting_recv = 0
        self._waiting_send = 0
        self._changed: anyio.Event | None = None
        self._watch = FdWatch(int(self._socket().getsockopt(zmq.FD)))

    def _resolve(self, address: str | None) -> str:
        if address is None:
            address = self._private_ipc("acollect-", "endpoint.sock")
        address = check_address(address)
        if address.startswith("tcp://") and address.endswith(":0"):
            address = address[:-2] + ":*"
        return address

    def _bind_error(self, address: str, exc: zmq.ZMQError) -> Exception:
        return TransportError(f"cannot bind {address}: {exc}")

    async def send(self, identity: bytes, frames: Sequence[Any], *, timeout: float = 10.0) -> None:
        """Sends one message to the worker with ``identity``.

        Args:
            identity: the worker's identity (as given to its :class:`WorkerSocket`).
            frames: bytes-like frames; big ones are sent without a copy.
            timeout: seconds to wait while the worker's queue is full.

        Raises:
            TransportError: no worker with that identity is connected, or ZeroMQ failed.
            TimeoutError: the message could not be queued within ``timeout``.
        """
        timeout = check_timeout(timeout)
        sock = self._socket()
        message = [identity, *frames]
        deadline: float | None = None  # from the first wait: a message that goes at once costs no clock
        try:
            while True:
                # ROUTER_MANDATORY refuses the whole message at its first frame when the worker's queue
                # is full (zmq.Again), so a retry never sends half a message.
                try:
                    sock.send_multipart(message, zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    pass
                else:
                    if self._waiting_recv or self._waiting_send:
                        self._after_success(sock)
                    return
                # No zmq.EVENTS check for ourselves: a ROUTER reports POLLOUT when *any* worker's queue has
                # room. But the attempt may have consumed the descriptor's signal of a message arriving.
                if self._waiting_recv and has_message(sock):
                    self._wake()
                now = anyio.current_time()
                if deadline is None:
                    deadline = now + timeout
                remaining = deadline - now
                if remaining <= 0:
                    raise TimeoutError(f"could not queue a message for worker {identity!r} within {timeout}s")
                await self._wait(min(remaining, _POLL_INTERVAL), receiving=False)
                sock = self._socket()
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise TransportError(f"no worker with identity {identity!r} is connected to {self._address}") from exc
            raise TransportError(f"sending to worker {identity!r} failed: {exc}") from exc

    async def recv(self, timeout: float) -> tuple[bytes, list[zmq.Frame]]:
        """Waits for the next message from any worker.

        Cancelling this call (e.g. with ``anyio.move_on_after``) loses no message:
        one is taken off the socket only when it is returned. A message already
        waiting is returned at once, without yielding to the event loop.

        Args:
            timeout: seconds to wait.

        Returns:
            ``(identity, frames)``: the sender's identity and its frames (zero-copy
            ``zmq.Frame`` objects, usable as buffers).

        Raises:
            TimeoutError: nothing arrived within ``timeout``.
            TransportError: the endpoint is closed or ZeroMQ failed.
        """
        timeout = check_timeout(timeout)
        sock = self._socket()
        deadline: float | None = None  # from the first wait: a waiting message costs no clock
        try:
            while True:
                # Only non-blocking calls, and no await between taking a message and returning it:
                # a cancellation can only land in _wait, while nothing has been taken. zmq.EVENTS is
                # asked first: it settles the socket's pending commands as a receive would, and an empty
                # socket costs no zmq.Again (an exception per look, several per batch).
                if has_message(sock):
                    try:
                        frames = recv_frames(sock)
                    except zmq.Again:
                        pass  # zmq.EVENTS promised one: wait as if empty (the wait is bounded, never a hang)
                    else:
                        if self._waiting_recv or self._waiting_send:
                            self._after_success(sock)
                        return frames[0].bytes, frames[1:]
                now = anyio.current_time()
                if deadline is None:
                    deadline = now + timeout
                remaining = deadline - now
                if remaining <= 0:
                    raise TimeoutError(f"no message arrived at {self._address} within {timeout}s")
                await self._wait(min(remaining, _POLL_INTERVAL), receiving=True)
                sock = self._socket()
        except zmq.ZMQError as exc:
            raise TransportError(f"receiving at {self._address} failed: {exc}") from exc

    async def _wait(self, timeout: float, *, receiving: bool) -> None:
        """Waits at most ``timeout`` seconds for the socket's state to change (then the caller tries again).

        One task waits on the descriptor (an event loop watches a descriptor for one reader); the
        others wait for it, or for a call on the socket, to tell them (:meth:`_wake`). The one on
        the descriptor waits through :class:`~acollect._runtime.fd_watch.FdWatch`, whose deadline
        and wake-up cost no scope and no cancellation (a wake-up follows many credits sent); the
        others' bound is an anyio scope: ``asyncio.wait_for`` before Python 3.12 swallows a
        cancellation that arrives as the wait completes, and it does not exist under trio.
        """
        if receiving:
            self._waiting_recv += 1
        else:
            self._waiting_send += 1
        try:
            if not self._watch.waiting:
                try:
                    await self._watch.wait(timeout)
                finally:
                    self._wake()  # the others look again; one of them watches the descriptor next
            else:
                if self._changed is None:
                    self._changed = anyio.Event()
                with anyio.move_on_after(timeout):
                    await self._changed.wait()
        finally:
            if receiving:
                self._waiting_recv -= 1
            else:
                self._waiting_send -= 1

    def _wake(self) -> None:
        """Makes every waiting task look at the socket again."""
        self._watch.wake()
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _after_success(self, sock: zmq.Socket[Any]) -> None:
        # The call processed ZeroMQ's pending commands, which may have consumed the descriptor's
        # signal that another task waits for: a message arriving, or a worker's queue draining
        # (which zmq.EVENTS cannot tell apart from another worker's, so senders always look).
        if self._waiting_send or has_message(sock):
            self._wake()

    def close(self) -> None:
        """Closes the socket and its context and removes a private ipc file (idempotent)."""
        if self._sock is not None:
            # A task waits on the descriptor: take it out of the event loop's hands before ZeroMQ closes it (and the
            # number goes to the next file opened).
            self._watch.closing()
            self._wake()
        super().close()

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
