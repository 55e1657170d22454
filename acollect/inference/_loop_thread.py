"""An inference server's loop in a thread of the trainer's process (``mode="thread"``).

No process to start, and no copy between the trainer's tensors and the server's; but the server's loop shares
the trainer's GIL, so every step of every worker waits while the trainer's own Python code runs (and the
other way round). The event loop hands requests to the thread through a :class:`~acollect.inference._loop.Mailbox`
(deques and a wake-up byte) and is woken by one when answers are ready.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
import torch

from acollect._devices import module_device
from acollect._runtime.auth import ClientKeys
from acollect._runtime.server_socket import ServerSocket
from acollect._runtime.tasks import TaskOwner
from acollect._runtime.threads import run_in_thread
from acollect._weights.updates import WeightStructure, structure_of
from acollect.inference._batching import InferenceRequest, ServerStatsRecorder
from acollect.inference._loop import Mailbox, ServerLoop, Ticket
from acollect.inference._server_spec import ServerSpec, build_policy, make_loop
from acollect.inference._slot_hub import SlotHub

__all__ = ["LoopThread"]


class LoopThread:
    """Runs an inference server's loop in a thread of this process.

    Args:
        spec: the server's settings.
        initial_version: the weights' version before the first update.
    """

    def __init__(self, spec: ServerSpec, initial_version: int) -> None:
        self.spec = spec
        self.recorder = ServerStatsRecorder(spec.max_batch_size)
        self.recorder.version = initial_version
        self.address: str | None = None
        self.slot_address: str | None = None
        self.structure: WeightStructure = {}
        self.policy_device: torch.device | None = None  # where the policy copy's weights are, once built
        self.loop: ServerLoop | None = None
        self._mail = Mailbox()
        self._sock: ServerSocket | None = None
        self._bound: ServerSocket | None = None  # kept after close, for its counts
        self._hub: SlotHub | None = None
        self._on_answer: Callable[[InferenceRequest | Ticket], None] = lambda _item: None
        self._thread_done = anyio.Event()
        self._started = False

    @property
    def rejected_peers(self) -> int:
        return self._bound.rejected_connections if self._bound is not None else 0

    async def start(
        self, tasks: TaskOwner, on_answer: Callable[[InferenceRequest | Ticket], None]
    ) -> list[anyio.CancelScope]:
        """Builds the policy copy (off the event loop), binds, and starts the thread."""
        self._on_answer = on_answer
        module = await run_in_thread(lambda _stop: build_policy(self.spec), name="inference-build")
        self.structure = structure_of(module)
        loop = self.loop = make_loop(self.spec, module, self._mail, self.recorder, self._close_socket)
        self.policy_device = module_device(module) or loop.forward.device
        self._sock = self._bound = loop.sock
        self._hub = loop.hub
        self.address = loop.sock.address if loop.sock is not None else None
        self.slot_address = loop.hub.path if loop.hub is not None else None
        self._started = True
        return [
            tasks.spawn(self._run_thread, name="inference-server"),
            tasks.spawn(self._deliver, name="inference-answers"),
        ]

    def submit(self, request: InferenceRequest) -> None:
        self._mail.inbox.append(request)
        self._mail.poke()

    async def submit_weights(self, ticket: Ticket) -> None:
        self._mail.tickets.append(ticket)
        self._mail.poke()

    def configure(self, **settings: int | None) -> None:
        if self.loop is not None:
            self.loop.configure(**settings)
        elif "max_batch_size" in settings:  # the loop's batcher, made at start, takes it from the spec (changed too)
            self.recorder.max_batch_size = settings["max_batch_size"]  # type: ignore[assignment]

    def local_client_keys(self, server_public: bytes) -> ClientKeys:
        assert self._sock is not None
        return self._sock.local_client_keys()

    async def flush(self, timeout: float = 10.0) -> None:
        """Nothing to wait for: this thread's commands take effect at once."""

    def failure_now(self) -> None:
        return None  # the thread's failure reaches the task group by itself

    async def _deliver(self) -> None:
        """Wakes the tasks whose requests the server thread answered."""
        while True:
            await anyio.wait_readable(self._mail.done_r)
            with contextlib.suppress(BlockingIOError):
                self._mail.done_r.recv(4096)
            while self._mail.answered:
                self._on_answer(self._mail.answered.popleft())

    async def _run_thread(self) -> None:
        assert self.loop is not None
        try:
            await run_in_thread(self.loop.serve, name="inference-server")
        finally:
            self._thread_done.set()

    async def close(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds for the thread (its task was cancelled: it stops), then frees the sockets."""
        if self._started:
            with anyio.move_on_after(timeout):
                await self._thread_done.wait()
        if (self._sock is not None and self._thread_done.is_set()) or not self._started:
            self._close_socket()
        self._mail.close()

    def abandon(self) -> None:
        """Frees what can be freed without waiting: the sockets once the thread is done (it owns them until then:
        its task was cancelled, so it stops within a pass, and the sockets go with it when it is collected)."""
        if self._thread_done.is_set() or not self._started:
            self._close_socket()
            self._mail.close()

    def _close_socket(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
