"""An env worker's side of central inference: a policy that asks an inference server for its actions.

:class:`RemotePolicy` is a :class:`~acollect._policy.PolicyAdapter` like any other, so a worker's
rollout engine runs unchanged: at each step it sends the observations to the server (raw tensor
frames over a ZeroMQ DEALER socket) and waits for the outputs; on the server's host, after the first step,
through a shared-memory slot instead (:mod:`acollect.inference._slots`: no encoding, a wake-up of 8 bytes).
The reply's weight version is
written, per step, under ``("collector", "policy_version")``, so every frame says which weights
chose its action.
"""

from __future__ import annotations

import threading

import torch
from tensordict import TensorDictBase

from acollect._policy import NestedKey, PolicyAdapter
from acollect._runtime.auth import ClientKeys
from acollect._runtime.worker_socket import WorkerSocket
from acollect.errors import TransportError
from acollect.inference import _messages as M
from acollect.inference._codec import Encoder, LayoutCache, encode, leaves_of
from acollect.inference._slots import SlotLink

__all__ = ["VERSION_KEY", "RemotePolicy"]

#: where a remote policy writes the version of the weights that chose each action
VERSION_KEY: tuple[str, str] = ("collector", "policy_version")

_POLL = 0.05  # how often a waiting step looks at its interrupt event
_SEND_TIMEOUT = 10.0


class RemotePolicy(PolicyAdapter):
    """Asks an inference server for the actions of a batch of observations (blocking).

    Args:
        address: the server's :attr:`~acollect.inference.InferenceServer.address`.
        identity: this client's name on the server (bytes, unique per client).
        interrupt: when set while a step waits for its answer, the step is abandoned with ``interrupted()``
            (the worker's pause and stop); the late answer is recognised and dropped.
        interrupted: the exception to raise then (the rollout engine's ``RolloutInterrupted``).
        timeout: seconds a step may wait for its answer before :class:`~acollect.errors.TransportError`.
        keys: connect as a CURVE client with this key pair, to a server started with ``keys=`` (which must hold
            the secret half of ``keys.server_public``, and accept ``keys.public``).
        slots: the server's :attr:`~acollect.inference.InferenceServer.slot_address`: after the first step,
            steps go through a shared-memory slot (if this process can reach it: the same host).
        source: the name the server counts this client's slot requests under when it asks whether every source
            waits (default ``identity``): a worker's two env groups share one.

    Raises:
        ConfigurationError: a bad argument (named).
    """

    reads_input_only = True  # it copies the observations into its slot, or encodes them

    def __init__(
        self,
        address: str,
        identity: bytes,
        *,
        interrupt: threading.Event | None = None,
        interrupted: type[BaseException] = InterruptedError,
        timeout: float = 60.0,
        keys: ClientKeys | None = None,
        slots: str | None = None,
        source: bytes | None = None,
    ) -> None:
        self._sock = WorkerSocket(address, identity, hwm=4, keys=keys)
        self._source = source if source is not None else identity
        self._pending: TensorDictBase | None = None  # a request sent as a message (None: through the slot)
        self._slot_path = slots  # tried once, after the first answer (which tells the actions' layout)
        self._link: SlotLink | None = None
        self._interrupt = interrupt
        self._interrupted = interrupted
        self._timeout = timeout
        self._seq = 0
        self._encoder = Encoder()
        self._layouts = LayoutCache(M.TO_CLIENT)
        #: the version of the weights behind the last answer
        self.version = 0
        self._versions: tuple[int, int, torch.Tensor] | None = None  # (version, rows, the per-row tensor)

    def __call__(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        self.submit(td)
        return self.receive()

    def submit(self, td: TensorDictBase) -> None:
        """Sends the observations of ``td`` (a step's first half): :meth:`receive` waits for their actions.

        A worker whose envs step in groups submits one group's observations, steps the others meanwhile,
        then receives.
        """
        self._seq += 1
        link = self._link
        if link is not None:
            leaves = leaves_of(td)
            if link.fits(leaves):
                link.request(self._seq, leaves)
                self._pending = None
                return
        frames = encode(M.REQUEST, self._seq, 0, td, self._encoder)
        self._sock.send(frames, timeout=_SEND_TIMEOUT, copy=M.copy_frames(frames))
        self._pending = td

    def receive(self) -> dict[NestedKey, torch.Tensor]:
        """The policy's outputs for the observations last submitted (blocking).

        Raises:
            TransportError: no answer within ``timeout``.
            BaseException: ``interrupted`` once ``interrupt`` is set (the late answer is dropped when it comes).
        """
        seq, td, link = self._seq, self._pending, self._link
        if td is None and link is not None:
            version = link.wait(seq, poll=_POLL, timeout=self._timeout, interrupt=self._interrupt)
            if version is None:
                raise self._interrupted
            self.version = version
            return self._result(link.act, link.rows, version)  # views of the slot: read before the next step
        waited = 0.0
        while True:
            if self._interrupt is not None and self._interrupt.is_set():
                raise self._interrupted
            received = self._sock.recv(timeout=_POLL)
            if received is None:
                waited += _POLL
                if waited > self._timeout:
                    raise TransportError(f"the inference server at {self._sock!r} gave no answer in {self._timeout}s")
                continue
            reply = self._layouts.decode(received)
            if reply.seq != seq:
                continue  # the answer to a step abandoned earlier
            self.version = reply.version
            if self._slot_path is not None and link is None and td is not None:
                path, self._slot_path = self._slot_path, None
                rows = int(td.batch_size[0]) if td.batch_dims else 0
                if rows == reply.rows and rows > 0:
                    self._link = SlotLink.open(path, self._source, rows, leaves_of(td), reply.leaves)
            return self._result(reply.leaves, reply.rows, reply.version)

    def answer_fileno(self) -> int | None:
        """A descriptor that turns readable when the answer to the last submitted step may have come (a slot's
        connection), to wait on several policies at once; ``None`` where answers come as messages."""
        link = self._link
        return link.fileno() if link is not None and self._pending is None else None

    def _result(self, leaves: dict, rows: int, version: int) -> dict[NestedKey, torch.Tensor]:
        result: dict[NestedKey, torch.Tensor] = {(k[0] if len(k) == 1 else k): v for k, v in leaves.items()}
        cached = self._versions
        if cached is None or cached[0] != version or cached[1] != rows:
            # The same tensor while the weights stay: the engine copies it into its batch and never writes it.
            cached = self._versions = (version, rows, torch.full((rows,), version, dtype=torch.int64))
        result[VERSION_KEY] = cached[2]
        return result

    def close(self) -> None:
        """Closes the connection and the slot (idempotent)."""
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self._sock.close()
