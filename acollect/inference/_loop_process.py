"""The trainer's side of an inference server process: start it, talk to it, notice its end, end it.

The server process (:mod:`acollect.inference._process_main`) is owned like a worker: started as a fresh
interpreter, handed its spec through its stdin, and watched. Its control socket closing is its end: this side
then reads its exit code (within a second) and fails with it, or with the traceback the process sent first; a
pass that never returns shows in the shared stats array as a hung server. A start that is cancelled, or fails,
kills the process at once. Shutdown asks it to stop, waits, then kills it: nothing is left running, and the
trainer dying closes the socket pair, which stops the server too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import torch

from acollect._batches.shm import ShmSegment
from acollect._devices import wait_ready
from acollect._runtime.auth import ClientKeys
from acollect._runtime.spawn import pickle_payload, reap_later, spawn_python
from acollect._runtime.tasks import TaskOwner
from acollect._runtime.threads import run_in_thread
from acollect._weights.sync import SharedMemWeightSyncScheme
from acollect._weights.updates import WeightStructure, decode_structure
from acollect.errors import (
    CollectorStateError,
    InferencePolicyError,
    InferenceServerError,
    ProtocolError,
    TransportError,
    describe_exit,
)
from acollect.inference import _control as control
from acollect.inference._batching import STATS_SIZE, InferenceRequest, ServerStatsRecorder
from acollect.inference._loop import Ticket
from acollect.inference._process_main import BOOTSTRAP, ProcessConfig
from acollect.inference._server_spec import ServerSpec

__all__ = ["LoopProcess"]

_START_TIMEOUT = 120.0  # importing torch and building a large policy on a loaded machine
_EXIT_GRACE = 1.0  # after its socket closed, how long a dead process may take to show its exit code
_POLL = 0.01


class LoopProcess:
    """Runs an inference server's loop in a process of its own.

    Args:
        spec: the server's settings (its policy cloudpickled to the process).
        initial_version: the weights' version before the first update.
    """

    def __init__(self, spec: ServerSpec, initial_version: int) -> None:
        self.spec = spec
        self._initial_version = initial_version
        self.recorder = ServerStatsRecorder(spec.max_batch_size)  # the shared stats array replaces it at start
        self.address: str | None = None
        self.slot_address: str | None = None
        self.structure: WeightStructure = {}
        self.policy_device: torch.device | None = None  # where the policy copy's weights are, as its hello said
        self.pid: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._stats_segment: ShmSegment | None = None
        # Weights go as they go to local workers: one flat buffer in a segment, rewritten by each update.
        self._weights = SharedMemWeightSyncScheme().make_writer()
        self._dir: str | None = None
        self._reader = control.FrameReader()
        self._ids = itertools.count(1)
        self._pending: dict[int, InferenceRequest | Ticket] = {}
        self._pings: dict[int, anyio.Event] = {}
        self._on_answer: Callable[[InferenceRequest | Ticket], None] = lambda _item: None
        self._failure: InferenceServerError | None = None
        self._closed_by_us = False
        self._staged: anyio.Event | None = None  # set once the process has copied the update out of the segment
        self._staged_id = 0

    @property
    def rejected_peers(self) -> int:
        return int(self.recorder.rejected_peers)

    # -- start -----------------------------------------------------------------------------------
    async def start(
        self, tasks: TaskOwner, on_answer: Callable[[InferenceRequest | Ticket], None]
    ) -> list[anyio.CancelScope]:
        """Starts the process and waits for its hello; on any failure or cancellation, nothing is left."""
        self._on_answer = on_answer
        try:
            await self._start()
        except BaseException:
            self._kill()  # no await: a cancelled start ends here at once
            raise
        return [tasks.spawn(self._read, name="inference-process")]

    async def _start(self) -> None:
        # The process's ipc path and slot listener live in a directory of ours: removed even if it is killed.
        self._dir = tempfile.mkdtemp(prefix="acollect-server-")
        self.spec = dataclasses.replace(
            self.spec,
            address=f"ipc://{self._dir}/server.sock" if self.spec.address == "ipc" else self.spec.address,
            slot_dir=self._dir,
        )
        segment = self._stats_segment = ShmSegment.create(STATS_SIZE * 8)
        self.recorder = ServerStatsRecorder(
            self.spec.max_batch_size, np.frombuffer(segment.buffer, np.float64, STATS_SIZE)
        )
        self.recorder.version = self._initial_version
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = parent_end
        control.configure(parent_end)
        try:
            payload = pickle_payload(
                ProcessConfig(self.spec, child_end.fileno(), segment.name),
                what="the policy to the inference server process",
                hint="it must be picklable with cloudpickle; pass policy_factory to build it there, or mode='thread'",
            )
            # vfork and exec: about a millisecond on the loop, like a spawned worker's start.
            self._popen = spawn_python(BOOTSTRAP, num_threads=self.spec.num_threads, pass_fds=(child_end.fileno(),))
        finally:
            child_end.close()  # the process holds its end: it closes when the process ends
        self.pid = self._popen.pid
        await run_in_thread(lambda _stop: self._write_payload(payload), name="inference-process-config")
        with anyio.fail_after(_START_TIMEOUT):
            hello = await self._expect("hello")
        segment.unlink()  # mapped on both sides: no name left to outlive them
        self.address, self.slot_address = hello.get("address"), hello.get("slots")
        self.structure = decode_structure(hello.get("structure")) or {}
        self.policy_device = torch.device(hello["device"]) if isinstance(hello.get("device"), str) else None

    def _write_payload(self, payload: bytes) -> None:
        assert self._popen is not None
        assert self._popen.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):  # it died before reading: its exit code says why
            self._popen.stdin.write(payload)
            self._popen.stdin.close()

    async def _expect(self, kind: str) -> dict[str, Any]:
        """The next message, which must be ``kind`` (during start, before the reader task runs)."""
        assert self._sock is not None
        while True:
            for message in self._reader.messages():
                if message["k"] == kind:
                    return message
                self._handle(message)  # "failed" raises
            await anyio.wait_readable(self._sock)
            if not control.read_available(self._sock, self._reader):
                for message in self._reader.messages():
                    self._handle(message)
                raise await self._death()

    # -- running ---------------------------------------------------------------------------------
    async def _read(self) -> None:
        """Hands answers to their callers; raises the process's end (a failure, or its exit code)."""
        assert self._sock is not None
        while True:
            await anyio.wait_readable(self._sock)
            alive = control.read_available(self._sock, self._reader)
            for message in self._reader.messages():
                self._handle(message)
            if not alive:
                if self._closed_by_us:
                    return
                raise await self._death()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["k"]
        if kind == "applied" and message.get("id") == self._staged_id:
            self._weights.unlink()  # the process mapped it (a new update rewrites it in place): no name left behind
            self._release_staging()
        if kind in ("answer", "applied"):
            item = self._pending.pop(message.get("id", -1), None)  # -1: no id, nobody waits on it
            if item is None:
                return  # its caller gave up
            item.version = int(message.get("version") or 0)
            if message.get("error") is not None:
                item.error = self._failed(str(message["error"]), policy=message.get("policy") is True)
            elif isinstance(item, InferenceRequest) and message.get("outputs") is not None:
                item.outputs = control.tensors_from_wire(message["outputs"])
            self._on_answer(item)
        elif kind == "pong":
            event = self._pings.pop(message.get("n", -1), None)
            if event is not None:
                event.set()
        elif kind == "failed":
            self._failure = self._failed(
                f"{message.get('type')}: {message.get('message')}",
                policy=message.get("policy") is True,
                type_name=str(message.get("type")),
                remote_traceback=str(message.get("traceback")),
            )
            self._answer_all(self._failure)
            raise self._failure
        elif kind != "hello":
            raise ProtocolError(f"an unknown message {kind!r:.40} from the inference server process")

    def _failed(
        self, what: str, *, policy: bool, type_name: str = "", remote_traceback: str = ""
    ) -> InferenceServerError:
        """The error for a failure the process reported: the policy's (it raised there), or the server's own."""
        details: dict[str, Any] = {"pid": self.pid, "type_name": type_name, "remote_traceback": remote_traceback}
        if policy:
            return InferencePolicyError(
                f"the policy raised in the inference server process (pid {self.pid}): {what}", **details
            )
        return InferenceServerError(f"the inference server process (pid {self.pid}) failed: {what}", **details)

    async def _death(self) -> InferenceServerError:
        """The error for a process whose control socket closed: its failure, or how it ended."""
        if self._failure is not None:
            return self._failure
        deadline = time.monotonic() + _EXIT_GRACE
        while self.exitcode() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (no event for an exit)
            await anyio.sleep(_POLL)
        self._failure = self.death_error()
        self._answer_all(self._failure)
        return self._failure

    def exitcode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def death_error(self) -> InferenceServerError:
        """The error saying the process ended (with its exit code, if it shows one yet)."""
        code = self.exitcode()
        how = describe_exit(code) if code is not None else "its control socket closed"
        return InferenceServerError(
            f"the inference server process (pid {self.pid}) died: {how}", exitcode=code, pid=self.pid
        )

    def failure_now(self) -> InferenceServerError | None:
        """The process's end, if it has ended (a failure it reported, or its exit code); else ``None``.

        Reads what the control socket holds first: a worker that lost its connection to a dying server may report
        before this side's reader has run, and the process's own word (a traceback, an exit code) comes first.
        """
        if self._failure is None and self._sock is not None and not self._closed_by_us:
            alive = control.read_available(self._sock, self._reader)
            with contextlib.suppress(InferenceServerError):  # a "failed" message: kept in self._failure
                for message in self._reader.messages():
                    self._handle(message)
            # A killed process's sockets close as it exits, in no set order: its workers may see theirs reset
            # before this side reads the end of the control socket, but by then its exit code shows.
            exited = self._popen is not None and self._popen.poll() is not None
            if self._failure is None and (exited or not alive):
                # Its sockets are closed: it is exiting, and its exit code shows within milliseconds.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    if self._popen is not None:
                        self._popen.wait(timeout=_EXIT_GRACE)
                self._failure = self.death_error()
                self._answer_all(self._failure)
        return self._failure

    def _release_staging(self) -> None:
        staged, self._staged = self._staged, None
        if staged is not None:
            staged.set()

    def _answer_all(self, error: BaseException) -> None:
        self._release_staging()
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.error = error
            self._on_answer(item)

    def _send(self, message: dict[str, Any]) -> None:
        if self._sock is None:
            raise CollectorStateError("the inference server process is not running")
        if self._failure is not None:
            raise self._failure
        control.send(self._sock, message)

    def submit(self, request: InferenceRequest) -> None:
        """Sends a request of the trainer's own (``infer()``); :meth:`_read` answers it."""
        n = next(self._ids)
        self._pending[n] = request
        self._send({"k": "infer", "id": n, "rows": request.rows, "leaves": control.tensors_to_wire(request.leaves)})

    async def submit_weights(self, ticket: Ticket) -> None:
        """Writes the weights into their segment (:class:`~acollect._weights.sync.SharedMemWeightSyncScheme`, as
        for local workers) and sends the command to copy them.

        The segment holds one update: a new one waits until the process has copied the last (even if that one's
        caller gave up waiting), so that nothing is overwritten under the copy.
        """
        while self._staged is not None:
            await self._staged.wait()
        if self._failure is not None:
            raise self._failure
        if ticket.ready:
            # CUDA weights: read once the caller's work on them is done (its streams are not this thread's),
            # copied to the host in a thread (a blocking copy of every parameter would stall the event loop).
            def write(_stop: object) -> dict[str, Any]:
                wait_ready(ticket.ready)
                return self._weights.write(ticket.weights)[0]

            entry = await run_in_thread(write, name="weights-to-server")
        else:
            entry = self._weights.write(ticket.weights)[0]
        n = next(self._ids)
        self._pending[n] = ticket
        self._staged, self._staged_id = anyio.Event(), n
        self._send({"k": "weights", "id": n, "models": [{"id": "policy", **entry}]})

    def configure(self, **settings: int | None) -> None:
        """Changes ``max_batch_size`` or ``sources`` in the process (from its next pass)."""
        if "max_batch_size" in settings:
            self.recorder.max_batch_size = settings["max_batch_size"]  # type: ignore[assignment]
        self._send({"k": "config", **settings})

    def local_client_keys(self, server_public: bytes) -> ClientKeys:
        """A fresh key pair the process accepts (once it has read the command: see :meth:`flush`)."""
        keys = ClientKeys.fresh(server_public)
        self._send({"k": "allow", "public": keys.public})
        return keys

    async def flush(self, timeout: float = 10.0) -> None:
        """Returns once the process has taken every command sent before."""
        n = next(self._ids)
        event = self._pings[n] = anyio.Event()
        self._send({"k": "ping", "n": n})
        with anyio.fail_after(timeout):
            await event.wait()

    # -- end -------------------------------------------------------------------------------------
    async def close(self, timeout: float) -> None:
        """Asks the process to stop, waits up to ``timeout`` seconds, then kills it; frees everything."""
        popen = self._popen
        self._closed_by_us = True
        if popen is not None and popen.poll() is None and self._sock is not None:
            with contextlib.suppress(OSError, TransportError):
                control.send(self._sock, {"k": "stop"})
            with anyio.move_on_after(timeout):
                while popen.poll() is None:  # noqa: ASYNC110 (no event for an exit)
                    await anyio.sleep(_POLL)
        self._kill()

    def abandon(self) -> None:
        """Kills the process and frees what this side holds, without waiting for anything (idempotent)."""
        self._kill(wait=False)

    def _kill(self, *, wait: bool = True) -> None:
        """Ends the process now and frees what this side holds (idempotent)."""
        self._closed_by_us = True
        popen = self._popen
        if popen is not None:
            if popen.poll() is None:
                with contextlib.suppress(OSError):
                    popen.kill()
                if wait:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        popen.wait(timeout=5.0)
                if popen.poll() is None:
                    reap_later(popen)
            if popen.stdin is not None:
                with contextlib.suppress(OSError):
                    popen.stdin.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        for pings in self._pings.values():
            pings.set()
        self._release_staging()
        self._weights.close()
        folder, self._dir = self._dir, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        segment, self._stats_segment = self._stats_segment, None
        if segment is not None:
            # The stats array stays mapped for stats() after the end (its figures are the last ones); the name goes.
            segment.unlink()
