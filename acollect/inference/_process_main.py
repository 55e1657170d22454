"""The inference server process: the server's loop with a GIL of its own.

Started by :class:`~acollect.inference._loop_process.LoopProcess` as a fresh interpreter (``python -c``,
like a spawned worker), it builds the policy from the spec (the policy, cloudpickled, or ``policy_factory``
called here), binds the address env workers reach it on (and their shared-memory slot listener), says hello
on its control socket and serves until told to stop, or until that socket closes: the trainer is gone (even
killed with SIGKILL), so nothing is left running. Whatever it bound or mapped is closed on the way out; a
failure goes to the trainer, traceback included and saying whether it was the policy's (raised while the policy was
built or in a forward pass), before the process exits with code 1.

The trainer reads its figures, its weight version and the start of a pass in progress from a stats array in
shared memory (:class:`~acollect.inference._batching.ServerStatsRecorder`). New weights come as they come to local
workers, one flat buffer in a shared-memory segment (:mod:`acollect._weights.sync`), checked against the policy here
and applied between two passes (:meth:`ServerLoop._apply_weights`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import socket
import threading
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from acollect._batches.shm import ShmSegment
from acollect._devices import module_device
from acollect._runtime.spawn import bootstrap, exit_now
from acollect._weights.sync import plan_unflatten, read_weights
from acollect._weights.updates import encode_structure
from acollect.errors import ProtocolError, TransportError
from acollect.inference import _control as control
from acollect.inference._batching import STATS_SIZE, InferenceRequest, ServerStatsRecorder
from acollect.inference._loop import ServerLoop, Ticket
from acollect.inference._server_spec import ServerSpec, build_policy, make_loop

__all__ = ["BOOTSTRAP", "ProcessConfig", "run_server_process"]

#: the server process's ``-c`` code (as for a spawned worker: the payload first, then the parent's import path)
BOOTSTRAP = bootstrap("acollect.inference._process_main", "main")


@dataclass
class ProcessConfig:
    """What the server process gets from its trainer (cloudpickled through its stdin)."""

    spec: ServerSpec
    #: this process's end of the control socket pair (inherited)
    control_fd: int
    #: the stats array's shared-memory segment
    stats_segment: str


class ControlMailbox:
    """The server loop's mail in a server process: commands from the control socket, answers back on it.

    Plays :class:`~acollect.inference._loop.Mailbox`'s part for :class:`ServerLoop` (both are the loop's
    :class:`~acollect.inference._loop.Mail`): ``inbox`` and ``tickets`` filled by :meth:`receive`,
    :meth:`answer` sending.
    """

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self.sock = sock
        self.stop = stop
        self.inbox: deque[InferenceRequest] = deque()
        self.tickets: deque[Ticket] = deque()
        self.loop: ServerLoop | None = None
        self.segments: dict[str, ShmSegment] = {}  # the weights' segment, attached at the first update
        self._reader = control.FrameReader()
        self._ids: dict[int, int] = {}  # id(ticket) -> the trainer's number for it

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> None:
        """Takes every command waiting on the control socket; the trainer closing it stops the server."""
        if not control.read_available(self.sock, self._reader):
            self.stop.set()  # the trainer is gone: stop serving
        for message in self._reader.messages():
            self._handle(message)

    def publish(self) -> None:
        """Copies the refused-peer count to the stats array, for the trainer's ``rejected_peers``."""
        loop = self.loop
        if loop is not None and loop.sock is not None:
            loop.recorder.rejected_peers = loop.sock.rejected_connections

    def _handle(self, message: dict[str, Any]) -> None:
        kind, loop = message["k"], self.loop
        assert loop is not None
        if kind == "infer":
            leaves = control.tensors_from_wire(message.get("leaves"))
            self.inbox.append(InferenceRequest(leaves, _int(message, "rows"), seq=_int(message, "id")))
        elif kind == "weights":
            ticket = Ticket(TensorDict())
            self._ids[id(ticket)] = _int(message, "id")
            try:
                ((layout, flat),) = read_weights(message, None, self.segments, None).values()
                # Checked against this copy of the policy before anything is copied, as a worker checks a push.
                plan = plan_unflatten(layout, flat, TensorDict.from_module(loop.forward.module))
            except ProtocolError as exc:  # refused whole: the policy keeps the weights it has
                ticket.error = exc
                self.answer(ticket)
                return
            ticket.weights = TensorDict({key: src.view(dtype).view(shape) for key, src, dtype, shape, _ in plan})
            self.tickets.append(ticket)
        elif kind == "config":
            if "max_batch_size" in message:
                loop.configure(max_batch_size=_int(message, "max_batch_size"))
            if "sources" in message:
                loop.configure(sources=None if message["sources"] is None else _int(message, "sources"))
        elif kind == "allow":
            if loop.sock is None or not isinstance(message.get("public"), bytes):
                raise ProtocolError("an allow command needs a server with keys and a public key (bytes)")
            loop.sock.allow(message["public"])
        elif kind == "ping":
            control.send(self.sock, {"k": "pong", "n": message.get("n")})
        elif kind == "stop":
            self.stop.set()
        else:
            raise ProtocolError(f"an unknown control message {kind!r:.40}")

    def answer(self, item: InferenceRequest | Ticket) -> None:
        """Sends an answer to the trainer: a request's outputs, or a weight update's version."""
        error = None if item.error is None else f"{type(item.error).__name__}: {item.error}"
        # Whether the error is the policy's own (a forward pass raised it), which the trainer raises as a PolicyError.
        policy = item.error is not None and self.loop is not None and item.error is self.loop.failed_pass
        if isinstance(item, Ticket):
            message = {
                "k": "applied",
                "id": self._ids.pop(id(item), 0),
                "version": item.version,
                "error": error,
                "policy": policy,
            }
        else:
            outputs = None if item.outputs is None else control.tensors_to_wire(item.outputs)
            message = {
                "k": "answer",
                "id": item.seq,
                "version": item.version,
                "outputs": outputs,
                "error": error,
                "policy": policy,
            }
        with contextlib.suppress(OSError, TransportError):  # the trainer is gone: nobody to tell
            control.send(self.sock, message)

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


def _int(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if type(value) is not int:
        raise ProtocolError(f"control message {message.get('k')!r}: {name} is {value!r:.40}, expected an int")
    return value


def run_server_process(config: ProcessConfig) -> int:
    """Serves until stopped; returns the exit code (0: stopped, 1: the policy or the server failed)."""
    spec = config.spec
    torch.set_num_threads(spec.num_threads)
    sock = socket.socket(fileno=config.control_fd)
    control.configure(sock)
    stats_segment = ShmSegment.attach(config.stats_segment, STATS_SIZE * 8)
    figures = np.frombuffer(stats_segment.buffer, dtype=np.float64, count=STATS_SIZE)
    stop = threading.Event()
    mail = ControlMailbox(sock, stop)
    loop: ServerLoop | None = None
    built = False  # a failure before the policy is built is the policy's (its factory raised, or it cannot move)
    code = 0
    try:
        recorder = ServerStatsRecorder(spec.max_batch_size, figures)
        module = build_policy(spec)
        built = True
        loop = mail.loop = make_loop(spec, module, mail, recorder, lambda: None)  # its sockets closed below
        loop.housekeeping = mail.publish
        control.send(
            sock,
            {
                "k": "hello",
                "pid": os.getpid(),
                "address": loop.sock.address if loop.sock is not None else None,
                "slots": loop.hub.path if loop.hub is not None else None,
                "structure": encode_structure(module),
                "device": str(module_device(module) or loop.forward.device),
            },
        )
        loop.serve(stop)
    except BaseException as exc:
        code = 1
        with contextlib.suppress(BaseException):
            control.send(
                sock,
                {
                    "k": "failed",
                    "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                    "message": str(exc),
                    "traceback": "".join(traceback.format_exception(exc)),
                    "policy": not built or (loop is not None and exc is loop.failed_pass),
                },
            )
    finally:
        for resource in (loop.hub, loop.sock) if loop is not None else ():
            if resource is not None:
                with contextlib.suppress(Exception):
                    resource.close()
        mail.close()
        if spec.slot_dir is not None:  # the trainer's directory for us: it may be gone (killed), so remove it here too
            shutil.rmtree(spec.slot_dir, ignore_errors=True)
        del figures
        with contextlib.suppress(Exception):
            stats_segment.close()
        with contextlib.suppress(OSError):
            sock.close()
    return code


def main(payload: bytes) -> None:
    """The process's entry point: ``payload`` is the cloudpickled :class:`ProcessConfig`."""
    config = pickle.loads(payload)
    exit_now(run_server_process(config))
