"""The inference server: one batched forward pass for many clients, in a thread of its own.

Clients are env worker processes (a :class:`~acollect.inference.client.RemotePolicy`: raw tensor frames over
ZeroMQ, never pickled, or on this host shared-memory slots, :mod:`acollect.inference.slots`) and async code in
this process (:meth:`InferenceServer.infer`). The server thread gathers their requests
(:class:`~acollect.inference.batching.Batcher`), concatenates them, runs the policy once on its device
and scatters the outputs back. The event loop never waits on a forward pass: it only hands requests to
the thread (a byte on a socket pair wakes it) and is woken by one when answers are ready.

Weights: the server runs its own *inference copy* of the policy. :meth:`InferenceServer.update_policy_weights_`
copies new weights into it between two forward passes, so training never races inference on the same
parameters, and every answer carries the version of the weights that produced it.

Life: the collectors' own state machine (:class:`~acollect._lifecycle.Lifecycle`, the same states and
table): ``NEW`` -> ``STARTING`` (:meth:`InferenceServer.start`, once) -> ``RUNNING``, ``BROKEN`` when a
task of its own fails (the failure kept, and raised from every later call), ``CLOSING`` -> ``CLOSED``.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._lifecycle import CollectorState, Lifecycle
from acollect._tasks import TaskOwner
from acollect._threads import run_in_thread
from acollect._validate import check_int, check_seconds
from acollect.devices import DeviceLike
from acollect.errors import CollectorStateError, ConfigurationError, PolicyError
from acollect.inference.batching import Batcher, Forward, InferenceStats, Request, StatsRecorder
from acollect.inference.codec import leaves_of
from acollect.inference.loop import Mailbox, ServerLoop, Ticket
from acollect.inference.slot_hub import SlotHub
from acollect.policy import PolicyLike, parse_exploration_type
from acollect.transport.auth import ClientKeys, ServerKeys, as_server_keys
from acollect.transport.server_socket import ServerSocket
from acollect.transport.shm import shm_available
from acollect.weights import as_weights, check_weights, one_source, structure_of

__all__ = ["InferenceServer"]

_CLOSE_TIMEOUT = 10.0


class InferenceServer:
    """Batches the observations of many clients into one forward pass of a policy, in its own thread.

    Args:
        policy: the policy (a ``TensorDictModule``, an ``nn.Module`` taking the observation, or a callable on
            TensorDicts). The server runs a copy of it (``copy.deepcopy``, moved to ``device``); the original
            stays the caller's, to train.
        policy_factory: a zero-argument callable building the server's policy instead of ``policy``.
        max_batch_size: the most observations in one forward pass.
        max_wait: seconds the oldest waiting request may wait for more to join it before the pass runs anyway.
        device: where the policy runs (``None``: where its parameters are, else the CPU).
        exploration_type: tensordict interaction type set around each forward pass (``"random"`` by default).
        address: ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` to serve worker processes on as well
            (``"ipc"`` or ``"tcp://<host>"`` pick a private path or a free port; ``None``: this process only).
        keys: CURVE keys, as a collector's ``keys=``: a key directory written by ``acollect keys`` or a
            ``ServerKeys``. Every connection to ``address`` is then encrypted, and only clients holding a key
            on the allow-list (or one from :meth:`local_client_keys`) are served; the others are refused and
            counted in :attr:`rejected_peers`. Needs an ``address``.
        hang_timeout: seconds a forward pass may run before the server counts as hung: it then fails (its
            callers, and a collector it serves, get a :class:`~acollect.errors.PolicyError` saying so).
            ``None``: no limit.
        slots: same-host workers (``"ipc"`` address, no ``keys``) step through shared memory, not messages.

    Examples:
        >>> import anyio, torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> net = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
        >>> async def main():
        ...     async with InferenceServer(net, max_batch_size=8, max_wait=0.001) as server:
        ...         obs = TensorDict({"observation": torch.zeros(3, 4)}, batch_size=[3])
        ...         out = await server.infer(obs)
        ...         return out["action"].shape, server.stats().rows
        >>> anyio.run(main)
        (torch.Size([3, 2]), 3)
    """

    def __init__(
        self,
        policy: PolicyLike = None,
        *,
        policy_factory: Callable[[], Any] | None = None,
        max_batch_size: int = 64,
        max_wait: float = 0.002,
        device: DeviceLike = None,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        address: str | None = None,
        keys: ServerKeys | str | os.PathLike[str] | None = None,
        hang_timeout: float | None = None,
        slots: bool = True,
    ) -> None:
        if (policy is None) == (policy_factory is None):
            raise ConfigurationError.bad_value(
                "policy", policy, "a policy, or None with a policy_factory (exactly one of the two)"
            )
        if policy_factory is not None and not callable(policy_factory):
            raise ConfigurationError.bad_value("policy_factory", policy_factory, "a zero-argument callable")
        self.max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
        self.max_wait = check_seconds("max_wait", max_wait, allow_zero=True)
        try:
            self.device = torch.device(device) if device is not None else None
        except (TypeError, RuntimeError) as exc:
            raise ConfigurationError.bad_value("device", device, "a torch device or None") from exc
        if address is not None and not (isinstance(address, str) and address.startswith(("ipc", "tcp://"))):
            raise ConfigurationError.bad_value(
                "address", address, "None, 'ipc', 'ipc://<path>' or 'tcp://<host>[:<port>]'"
            )
        self._address_arg = address
        self._keys = as_server_keys("keys", keys)
        if self._keys is not None and address is None:
            raise ConfigurationError.bad_value(
                "keys", keys, "None when address is None (keys guard the connections of worker processes)"
            )
        self.hang_timeout = check_seconds("hang_timeout", hang_timeout, optional=True)
        self._policy_arg = policy
        self._policy_factory = policy_factory
        self._exploration = parse_exploration_type(exploration_type)
        self.batcher = Batcher(self.max_batch_size, self.max_wait)
        self._recorder = StatsRecorder(self.max_batch_size)
        self._initial_version = 0
        self._loop: ServerLoop | None = None
        self._mail = Mailbox()
        self._events: dict[Request | Ticket, anyio.Event] = {}  # the tasks waiting for an answer
        self._sock: ServerSocket | None = None
        self._slots = bool(slots)
        self._hub: SlotHub | None = None  # same-host workers' shared-memory slots (owned like the socket)
        self._bound: ServerSocket | None = None  # the socket bound, kept after close for its counts
        self._address: str | None = None
        self._tasks: TaskOwner | None = None
        self._own_tasks = False
        self._scopes: list[anyio.CancelScope] = []
        self._thread_done = anyio.Event()
        self._lifecycle = Lifecycle()  # the collectors' state machine: NEW, STARTING, RUNNING, BROKEN, CLOSED

    # -- life ----------------------------------------------------------------------------------
    @property
    def address(self) -> str | None:
        """Where worker processes connect (the real path or port), once started with an ``address``."""
        return self._address

    @property
    def slot_address(self) -> str | None:
        return self._hub.path if self._hub is not None else None  # same-host workers' slots (None: messages only)

    @property
    def secure(self) -> bool:
        """Whether connections to :attr:`address` are encrypted and authenticated (``keys=``)."""
        return self._keys is not None

    @property
    def rejected_peers(self) -> int:
        """Connection attempts refused by the server's CURVE keys (a key not on the allow-list, no CURVE, a
        wrong server key); each attempt of a peer that keeps retrying counts. ``0`` without ``keys``."""
        bound = self._bound
        return bound.rejected_connections if bound is not None else 0

    def local_client_keys(self) -> ClientKeys:
        """A fresh key pair the server accepts, for worker processes its owner starts (handed over privately).

        Raises:
            CollectorStateError: the server has no keys, or is not bound (started) yet.
        """
        sock = self._sock
        if self._keys is None or sock is None:
            raise CollectorStateError("local_client_keys() needs a started inference server with keys")
        return sock.local_client_keys()

    def hung_error(self, timeout: float | None = None) -> PolicyError | None:
        """The error of a hung server (a :class:`~acollect.errors.PolicyError` naming it, how long the pass has run
        and the timeout) if a forward pass has run longer than ``timeout`` (default ``hang_timeout``), else ``None``."""
        limit = self.hang_timeout if timeout is None else timeout
        if limit is None or self._loop is None:
            return None
        return self._loop.hung_error(limit, f" at {self._address}" if self._address is not None else "")

    @property
    def version(self) -> int:
        """Version of the weights the next forward pass runs with."""
        return self._loop.version if self._loop is not None else self._initial_version

    @version.setter
    def version(self, value: int) -> None:
        self._initial_version = check_int("version", value)
        if self._loop is not None:
            self._loop.version = self._initial_version

    @property
    def running(self) -> bool:
        """Whether the server answers requests."""
        return self._lifecycle.state is CollectorState.RUNNING

    def set_max_batch_size(self, value: int) -> None:
        """Changes ``max_batch_size`` (from the next forward pass on)."""
        self.max_batch_size = self.batcher.max_batch_size = self._recorder.max_batch_size = check_int(
            "max_batch_size", value, minimum=1
        )

    def expect_sources(self, sources: int | None) -> None:
        """Runs a pass as soon as this many distinct remote clients (worker processes) all wait."""
        self.batcher.sources = sources

    async def __aenter__(self) -> InferenceServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.async_shutdown()

    async def start(self, tasks: TaskOwner | None = None) -> None:
        """Builds the inference copy of the policy, binds ``address`` and starts the server thread.

        Args:
            tasks: the task group to run in (a collector's); ``None``: the server's own.
        """
        if self._lifecycle.state is not CollectorState.NEW:
            raise CollectorStateError(f"an inference server starts once (it is {self._lifecycle.state.value})")
        self._lifecycle.move(CollectorState.STARTING)
        module = await run_in_thread(lambda _stop: self._build(), name="inference-build")
        forward = Forward(module, self._device_of(module), self._exploration)
        if self._address_arg is not None:
            self._bind(self._address_arg)
        self._loop = ServerLoop(self._mail, self.batcher, forward, self._recorder, self._sock, self._close_socket,
                                self._hub)  # fmt: skip
        self._loop.version = self._initial_version
        if tasks is None:
            tasks = TaskOwner("InferenceServer", on_failure=self._fail)
            tasks.ensure_group()
            await tasks.started()
            self._own_tasks = True
        self._tasks = tasks
        self._lifecycle.setup_finished()
        self._scopes = [
            tasks.spawn(self._run_thread, name="inference-server"),
            tasks.spawn(self._deliver, name="inference-answers"),
        ]
        if self.hang_timeout is not None:
            self._scopes.append(tasks.spawn(self._watch, self.hang_timeout, name="inference-liveness"))

    def _build(self) -> Any:
        module = self._policy_factory() if self._policy_factory is not None else copy.deepcopy(self._policy_arg)
        if isinstance(module, torch.nn.Module):
            if self.device is not None:
                module = module.to(self.device)
            module.eval()
        return module

    def _device_of(self, module: Any) -> torch.device:
        if self.device is not None:
            return self.device
        if isinstance(module, torch.nn.Module):
            for tensor in (*module.parameters(), *module.buffers()):
                return tensor.device
        return torch.device("cpu")

    def _bind(self, address: str) -> None:
        # Many workers each keep one request in flight: the queue bound is generous, the heartbeats a
        # worker's own (a worker that vanished is noticed alike from either side).
        self._sock = self._bound = ServerSocket(
            address, hwm=1024, heartbeat_ivl=1.0, heartbeat_timeout=10.0, keys=self._keys
        )
        self._address = self._sock.address
        if self._slots and self._keys is None and address.startswith("ipc") and shm_available():
            self._hub = SlotHub()

    async def async_shutdown(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        """Stops the server thread, answers every waiting caller with an error and frees the sockets. Idempotent.

        Args:
            timeout: seconds to wait for the server thread (and the server's own tasks) to end.
        """
        lifecycle = self._lifecycle
        if lifecycle.closing:
            return
        started = lifecycle.set_up  # the thread runs (or ran, until a failure)
        lifecycle.move(CollectorState.CLOSING)
        try:
            await self._close(timeout, started)
        finally:
            lifecycle.move(CollectorState.CLOSED)

    async def _close(self, timeout: float, started: bool) -> None:
        with anyio.CancelScope(shield=True):
            for scope in self._scopes:
                scope.cancel()
            if started:
                with anyio.move_on_after(timeout):
                    await self._thread_done.wait()
            if self._own_tasks and self._tasks is not None:
                await self._tasks.aclose(timeout)
        for event in self._events.values():
            event.set()  # their requests have no outputs: the callers raise that the server closed
        if (self._sock is not None and self._thread_done.is_set()) or not started:
            self._close_socket()
        self._mail.close()

    async def aclose(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        """An alias of :meth:`async_shutdown`, for code that closes async resources with ``aclose()``."""
        await self.async_shutdown(timeout)

    def _close_socket(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _fail(self, exc: BaseException) -> None:
        if self._lifecycle.failure is None and not self._lifecycle.closing:
            self._lifecycle.move(CollectorState.BROKEN, failure=exc)
        for event in self._events.values():
            event.set()

    def _check_running(self, what: str) -> None:
        failure = self._lifecycle.failure
        if failure is not None:
            raise CollectorStateError(f"{what}: the inference server failed") from failure
        state = self._lifecycle.state
        if state is not CollectorState.RUNNING:
            raise CollectorStateError(f"{what}: the inference server is not running (it is {state.value}; use "
                                      "`async with InferenceServer(...)` or `await server.start()`)")  # fmt: skip

    # -- in-process clients ---------------------------------------------------------------------
    async def infer(self, td: TensorDictBase) -> TensorDictBase:
        """Runs the policy on ``td`` (batched with whatever else is waiting) and writes its outputs into it.

        Args:
            td: observations, ``[n, ...]`` or a single unbatched one, with the keys the policy reads.

        Returns:
            ``td`` itself, with the policy's outputs (``"action"``, ...) set, like a ``TensorDictModule`` call.

        Raises:
            CollectorStateError: the server is not running, or closed before answering.
            Exception: what the policy raised, with its traceback.
        """
        self._check_running("infer()")
        if not isinstance(td, TensorDictBase):
            raise ConfigurationError.bad_value("td", td, "a TensorDict of observations")
        single = td.batch_dims == 0
        batched = td.unsqueeze(0) if single else td
        request = Request(leaves_of(batched), int(batched.batch_size[0]))
        event = self._events[request] = anyio.Event()
        self._mail.inbox.append(request)
        self._mail.poke()
        try:
            await event.wait()
        except BaseException:
            request.abandoned = True
            raise
        finally:
            del self._events[request]
        if request.error is not None:
            raise request.error
        if request.outputs is None:
            self._check_running("infer()")
            raise CollectorStateError("infer(): the inference server closed before answering")
        for key, value in request.outputs.items():
            td.set(key, value.squeeze(0) if single else value)
        return td

    async def update_policy_weights_(
        self,
        policy_or_weights: torch.nn.Module | TensorDictBase | Mapping[str, torch.Tensor] | None = None,
        *,
        policy: torch.nn.Module | None = None,
        weights: TensorDictBase | Mapping[str, torch.Tensor] | None = None,
    ) -> int:
        """Copies new weights into the server's policy between two forward passes; returns the new version.

        Returns once the copy is done: the next pass (and every answer it gives) uses them.

        Args:
            policy_or_weights: an ``nn.Module``, a TensorDict of weights (``TensorDict.from_module`` layout) or a
                state dict; nothing: the weights of the ``policy`` given at construction.
            policy: keyword form for a module.
            weights: keyword form for weights.

        Raises:
            ConfigurationError: the weights do not fit the server's policy (nothing changed).
        """
        source = one_source(policy_or_weights=policy_or_weights, policy=policy, weights=weights)
        source = self._policy_arg if source is None else source
        self._check_running("update_policy_weights_()")
        assert self._loop is not None
        checked = check_weights(as_weights(source), structure_of(self._loop.forward.module), what="the server's policy")
        ticket = Ticket(checked)
        event = self._events[ticket] = anyio.Event()
        self._mail.tickets.append(ticket)
        self._mail.poke()
        try:
            await event.wait()
        except BaseException:
            ticket.abandoned = True
            raise
        finally:
            del self._events[ticket]
        if ticket.error is not None:
            raise ticket.error
        if not ticket.version:
            self._check_running("update_policy_weights_()")
            raise CollectorStateError("update_policy_weights_(): the inference server closed before applying them")
        return ticket.version

    def stats(self) -> InferenceStats:
        """Forward passes, batch sizes and their fill rate, latency (see :class:`InferenceStats`)."""
        return self._recorder.snapshot(self.version, self.rejected_peers)

    async def _watch(self, timeout: float) -> None:
        """Fails the server once a forward pass has run longer than ``timeout``: callers learn the server is
        hung, rather than waiting for ever (or blaming the clients that wait on it)."""
        period = min(1.0, timeout / 4)
        while True:
            await anyio.sleep(period)
            error = self.hung_error()
            if error is not None:
                raise error

    async def _deliver(self) -> None:
        """Wakes the tasks whose requests the server thread answered."""
        while True:
            await anyio.wait_readable(self._mail.done_r)
            with contextlib.suppress(BlockingIOError):
                self._mail.done_r.recv(4096)
            while self._mail.answered:
                event = self._events.get(self._mail.answered.popleft())
                if event is not None:
                    event.set()

    async def _run_thread(self) -> None:
        assert self._loop is not None
        try:
            await run_in_thread(self._loop.serve, name="inference-server")
        finally:
            self._thread_done.set()
