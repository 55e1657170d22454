"""The inference server's end of the shared-memory slots: a Unix socket listener and one slot per worker.

Run by the server's thread (:class:`~acollect.inference._loop.ServerLoop`), non-blocking throughout: it
accepts connections on a ``SOCK_SEQPACKET`` socket in a private directory (mode 0700: only this user's
processes reach it), attaches each worker's slot from its hello (:mod:`acollect.inference._slots`: a
validated layout, a segment name; nothing unpickled), turns every 8-byte wake-up into a
:class:`~acollect.inference._batching.InferenceRequest` whose observations are the slot's own views, and answers one by
writing its actions into the slot's ``act`` area, in place, then sending 16 bytes. A worker that goes away
closes its connection: its slot is unmapped, nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections import deque
from collections.abc import Callable, Collection

import msgpack

from acollect._batches.shm import ShmTensorDictSlot
from acollect.errors import ProtocolError, TransportError
from acollect.inference._batching import Batcher, InferenceRequest
from acollect.inference._slots import MAX_HELLO, READY, REPLY, slot_leaves

__all__ = ["SlotHub"]

_BACKLOG = 256


class _Client:
    """One worker's connection and, once it said hello, its slot."""

    __slots__ = ("act", "identity", "obs", "rows", "slot", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.slot: ShmTensorDictSlot | None = None
        self.identity = b""
        self.rows = 0
        self.obs: dict = {}
        self.act: dict = {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.slot is not None:
            self.obs, self.act = {}, {}
            self.slot.close()
            self.slot = None


class SlotHub:
    """Workers' slots and their wake-ups, for the server thread.

    Args:
        on_malformed: called with the error of a hello or a packet that is not well-formed (the connection is
            then closed): the server counts and logs it as a dropped request.
        directory: where to listen (a private directory of the caller's, mode 0700); ``None``: a fresh one.
    """

    def __init__(
        self, on_malformed: Callable[[bytes, BaseException], None] | None = None, directory: str | None = None
    ) -> None:
        # A private directory of its own, removed at close; or the owner's (a server process's trainer removes it
        # even if the process is killed), where only the socket is removed.
        folder = tempfile.mkdtemp(prefix="acollect-slots-") if directory is None else directory
        self._dir: str | None = folder if directory is None else None
        self.path = os.path.join(folder, "slots.sock")
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._listener.bind(self.path)
            self._listener.listen(_BACKLOG)
            self._listener.setblocking(False)
        except OSError as exc:
            self.close()
            raise TransportError(f"cannot listen for inference slots at {self.path}: {exc}") from exc
        self._clients: dict[int, _Client] = {}
        # Slots whose answer did not fit (found by a pass thread): dropped by the loop thread, which owns the set.
        self._unfit: deque[tuple[int, BaseException]] = deque()
        #: told of every malformed hello or packet (the connection is then closed)
        self.on_malformed = on_malformed
        #: called when the set of descriptors to watch changes (the server thread's waiter)
        self.on_fds: Callable[[list[int], list[int]], None] | None = None

    def fds(self) -> list[int]:
        """The descriptors to wait on: the listener's and every connection's."""
        listener = [self._listener.fileno()] if self._listener is not None else []
        return listener + list(self._clients)

    @property
    def clients(self) -> int:
        """Workers whose slots are attached."""
        return sum(1 for c in self._clients.values() if c.slot is not None)

    def take(self, batcher: Batcher, ready: Collection[int] | None = None) -> None:
        """Accepts new connections and adds every waiting request to ``batcher``.

        Args:
            batcher: where the requests go.
            ready: the descriptors a wait found readable (``None``: try every one).
        """
        while self._unfit:
            fd, error = self._unfit.popleft()
            client = self._clients.get(fd)
            if client is not None:
                self._malformed(fd, client, error)
        listener = self._listener
        if listener is not None and (ready is None or listener.fileno() in ready):
            self._accept()
        for fd, client in list(self._clients.items()):
            if ready is not None and fd not in ready:
                continue
            while fd in self._clients:
                try:
                    packet = client.sock.recv(MAX_HELLO if client.slot is None else READY.size + 1)
                except BlockingIOError:
                    break
                except OSError:
                    packet = b""
                if not packet:  # the worker closed its end (stopped, or died)
                    self._drop(fd)
                    break
                if client.slot is None:
                    self._hello(fd, client, packet)
                    continue
                if len(packet) != READY.size:
                    self._malformed(fd, client, ProtocolError(f"a slot wake-up of {len(packet)} bytes, expected 8"))
                    break
                (seq,) = READY.unpack(packet)
                batcher.add(
                    InferenceRequest(
                        client.obs, client.rows, seq=seq, source=client.identity, answer=self._answerer(client)
                    )
                )

    def _answerer(self, client: _Client) -> Callable[[InferenceRequest], None]:
        def answer(request: InferenceRequest) -> None:
            self._answer(client, request)

        return answer

    def _answer(self, client: _Client, request: InferenceRequest) -> None:
        """Writes the actions into the slot and wakes its worker (from the thread that ran the pass)."""
        outputs, act = request.outputs, client.act
        if outputs is None or client.slot is None:
            return
        try:
            for key, view in act.items():
                view.copy_(outputs[key])
        except (KeyError, RuntimeError) as exc:  # the policy's outputs changed since the slot was made
            self._unfit.append((client.sock.fileno(), ProtocolError(f"actions do not fit the slot: {exc}")))
            return
        # A worker that stopped reading loses the answer (as a ROUTER drops it): it recognises late ones anyway.
        with contextlib.suppress(BlockingIOError, OSError):
            client.sock.send(REPLY.pack(request.seq, request.version))

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, OSError):
                return
            sock.setblocking(False)
            self._clients[sock.fileno()] = _Client(sock)
            if self.on_fds is not None:
                self.on_fds([sock.fileno()], [])

    def _hello(self, fd: int, client: _Client, packet: bytes) -> None:
        try:
            hello = msgpack.unpackb(packet, raw=False, strict_map_key=True, max_ext_len=0)
            if not (
                isinstance(hello, dict)
                and isinstance(hello.get("identity"), bytes)
                and isinstance(hello.get("name"), str)
                and isinstance(hello.get("layout"), dict)
            ):
                raise ProtocolError("a slot hello is a map with identity (bytes), name (str) and layout (map)")
            slot = ShmTensorDictSlot.attach(hello["name"], hello["layout"])  # validates both
        except Exception as exc:
            self._malformed(fd, client, ProtocolError(f"a malformed slot hello ({type(exc).__name__}: {exc})"))
            return
        client.slot, client.identity = slot, hello["identity"]
        client.rows = int(slot.tensordict.batch_size[0]) if slot.tensordict.batch_dims else 0
        client.obs, client.act = slot_leaves(slot, "obs"), slot_leaves(slot, "act")
        if not client.obs or not client.act or not client.rows:
            self._malformed(fd, client, ProtocolError("a slot needs rows, observations and actions"))
            return
        with contextlib.suppress(BlockingIOError, OSError):
            client.sock.send(b"ok")

    def _malformed(self, fd: int, client: _Client, error: BaseException) -> None:
        if self.on_malformed is not None:
            self.on_malformed(client.identity or b"slot", error)
        self._drop(fd)

    def _drop(self, fd: int) -> None:
        client = self._clients.pop(fd, None)
        if client is not None:
            if self.on_fds is not None:
                self.on_fds([], [fd])
            client.close()

    def close(self) -> None:
        """Closes every connection and slot, and the listener; removes its directory. Idempotent."""
        for fd in list(self._clients):
            self._drop(fd)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
