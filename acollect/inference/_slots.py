"""Per-step data through shared memory: a same-host worker's observation and action slots, and their wake-ups.

A worker on the server's host does not encode its observations at every step. Once its first request went
the message way (:mod:`acollect.inference._codec`), and so both layouts are known, it creates one
shared-memory segment (:class:`~acollect._batches.shm.ShmTensorDictSlot`) holding an ``obs`` and an ``act``
area of its ``rows`` rows, connects a Unix ``SOCK_SEQPACKET`` socket to the server's slot listener
(:class:`~acollect.inference._slot_hub.SlotHub`), says hello (the segment's name and layout, msgpack) and,
once the server has attached, unlinks the segment: nothing of it can outlive both processes.

Then a step is: copy the observations into ``obs`` (in place), send 8 bytes (the request's number), wait
for 16 bytes back (the same number and the version of the weights that acted); the actions are in ``act``,
written there in place by the server. A reply whose number is not the step's (the answer to a step that a
pause abandoned) is dropped: one connection delivers in order, so it always comes before the right one, and
the server writes every request's actions in the order the requests came.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Mapping

import msgpack
import torch
from tensordict import TensorDict

from acollect._batches.shm import ShmTensorDictSlot, shm_available
from acollect._runtime.wire import encode_tensordict
from acollect.errors import TransportError
from acollect.inference._codec import Key, leaves_of

__all__ = ["READY", "REPLY", "SlotLink", "slot_layout", "slot_leaves"]

#: a step's request: its number
READY = struct.Struct("<q")
#: the answer: the request's number and the version of the weights that chose its actions
REPLY = struct.Struct("<qq")
#: the most bytes a hello may have (a layout of a few hundred leaves)
MAX_HELLO = 1 << 16

_HELLO_TIMEOUT = 10.0


def slot_layout(rows: int, obs: Mapping[Key, torch.Tensor], act: Mapping[Key, torch.Tensor]) -> dict[str, object]:
    """The layout of a slot: ``obs`` and ``act`` areas of ``rows`` rows, with the leaves' dtypes and shapes."""
    td = TensorDict({}, batch_size=[rows])
    for area, leaves in (("obs", obs), ("act", act)):
        td.set(area, TensorDict({}, batch_size=[rows]))
        for key, value in leaves.items():
            td.set((area, *key), torch.empty(value.shape, dtype=value.dtype))
    layout, _ = encode_tensordict(td)
    return layout


def slot_leaves(slot: ShmTensorDictSlot, area: str) -> dict[Key, torch.Tensor]:
    """The views of one area (``"obs"`` or ``"act"``) of ``slot`` by key (the area's name left out)."""
    sub = slot.tensordict.get(area, None)
    if not isinstance(sub, TensorDict):
        return {}
    return leaves_of(sub)


class SlotLink:
    """A worker's end: one slot in shared memory and the socket that says when it is full, or answered.

    Use :meth:`open`; ``None`` from it means the slot way is not to be had (another host, no ``/dev/shm``)
    and the caller keeps sending messages.
    """

    def __init__(self, sock: socket.socket, slot: ShmTensorDictSlot) -> None:
        self._sock = sock
        self._slot = slot
        self.rows = int(slot.tensordict.batch_size[0])
        self.obs = slot_leaves(slot, "obs")
        self.act = slot_leaves(slot, "act")

    @classmethod
    def open(
        cls,
        path: str,
        identity: bytes,
        rows: int,
        obs: Mapping[Key, torch.Tensor],
        act: Mapping[Key, torch.Tensor],
    ) -> SlotLink | None:
        """Connects to the slot listener at ``path`` and hands it a fresh slot; ``None`` if it cannot."""
        if not shm_available():
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        slot: ShmTensorDictSlot | None = None
        try:
            sock.settimeout(_HELLO_TIMEOUT)
            sock.connect(path)
            slot = ShmTensorDictSlot.create(slot_layout(rows, obs, act))
            hello = msgpack.packb({"identity": identity, "name": slot.name, "layout": slot.layout}, use_bin_type=True)
            sock.sendall(hello)
            ack = sock.recv(16)  # the server attached (or refused: the connection closes)
            slot.unlink()  # mapped on both sides now: the name is no longer needed
            if ack != b"ok":
                raise OSError(f"the slot listener refused the slot ({ack!r:.40})")
        except OSError:
            sock.close()
            if slot is not None:
                slot.close()
                slot.unlink()
            return None
        return cls(sock, slot)

    def fileno(self) -> int:
        """The descriptor that turns readable when an answer came (to wait on several slots at once)."""
        return self._sock.fileno()

    def fits(self, leaves: Mapping[Key, torch.Tensor]) -> bool:
        """Whether ``leaves`` are exactly the slot's observations (keys, dtypes, shapes)."""
        if leaves.keys() != self.obs.keys():
            return False
        return all(v.dtype == self.obs[k].dtype and v.shape == self.obs[k].shape for k, v in leaves.items())

    def request(self, seq: int, leaves: Mapping[Key, torch.Tensor]) -> None:
        """Copies the observations into the slot and tells the server request ``seq`` is there."""
        for key, view in self.obs.items():
            view.copy_(leaves[key])
        self._sock.settimeout(_HELLO_TIMEOUT)
        try:
            self._sock.send(READY.pack(seq))
        except OSError as exc:
            raise TransportError(f"the inference server's slot connection failed: {exc}") from exc

    def wait(self, seq: int, *, poll: float, timeout: float, interrupt: threading.Event | None) -> int | None:
        """The version of the weights that answered request ``seq`` (its actions are in :attr:`act`);
        ``None`` if ``interrupt`` was set first.

        Raises:
            TransportError: no answer within ``timeout`` seconds, or the server closed the connection.
        """
        deadline = time.monotonic() + timeout
        self._sock.settimeout(poll)
        while True:
            if interrupt is not None and interrupt.is_set():
                return None
            try:
                packet = self._sock.recv(REPLY.size)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TransportError(f"the inference server gave no answer in {timeout}s") from None
                continue
            except OSError as exc:
                raise TransportError(f"the inference server's slot connection failed: {exc}") from exc
            if len(packet) != REPLY.size:
                raise TransportError("the inference server closed its slot connection")
            answered, version = REPLY.unpack(packet)
            if answered == seq:
                return int(version)

    def close(self) -> None:
        """Closes the connection and unmaps the slot (idempotent)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        self.obs, self.act = {}, {}
        self._slot.close()
