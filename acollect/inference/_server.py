"""The inference server: one batched forward pass for many clients, in a process of its own by default.

Clients are env worker processes (a :class:`~acollect.inference.client.RemotePolicy`: on this host,
shared-memory slots, :mod:`acollect.inference._slots`; from other hosts, raw tensor frames over ZeroMQ, never
pickled) and async code in this process (:meth:`InferenceServer.infer`). The server's loop gathers their requests
(:class:`~acollect.inference._batching.Batcher`), concatenates them, runs the policy once on its device and
scatters the outputs back.

Where the loop runs (``mode``):

* ``"process"`` (the default, :mod:`acollect.inference._loop_process`): a process of its own, owned like a
  worker. Workers reach it directly, so no step waits for the trainer's GIL, and the trainer's Python code
  never waits for the server's. The trainer reads its figures from shared memory and sends weights through
  shared memory; its crash or hang breaks its owner within about a second, with its exit code or traceback.
* ``"thread"`` (:mod:`acollect.inference._loop_thread`): a thread of this process. Nothing to start and no copy
  of the trainer's own requests, but every forward pass and every step's bookkeeping shares the trainer's GIL.

Weights: the server runs its own *inference copy* of the policy. :meth:`InferenceServer.update_policy_weights_`
copies new weights into it between two forward passes, so training never races inference on the same
parameters, and every answer carries the version of the weights that produced it.

Life: the collectors' own state machine (:class:`~acollect._runtime.lifecycle.Lifecycle`, the same states and
table): ``NEW`` -> ``STARTING`` (:meth:`InferenceServer.start`, once) -> ``RUNNING``, ``BROKEN`` when a
task of its own fails (the failure kept, and raised from every later call), ``CLOSING`` -> ``CLOSED``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._devices import DeviceLike, with_index
from acollect._policy import PolicyLike, parse_exploration_type
from acollect._runtime.auth import ClientKeys, ServerKeys, as_server_keys
from acollect._runtime.lifecycle import CloseReason, CollectorState, Lifecycle
from acollect._runtime.loops import current_backend
from acollect._runtime.tasks import TaskOwner
from acollect._validate import check_int, check_seconds
from acollect._warnings import warn_unclosed
from acollect._weights.updates import as_weights, check_weights, one_source
from acollect.errors import CollectorStateError, ConfigurationError, InferenceServerError, PolicyError
from acollect.inference._batching import InferenceStats, ServerStatsRecorder
from acollect.inference._local_calls import LocalCalls
from acollect.inference._loop_process import LoopProcess
from acollect.inference._loop_thread import LoopThread
from acollect.inference._server_spec import ServerSpec

__all__ = ["InferenceServer"]

_CLOSE_TIMEOUT = 10.0

#: where the server's loop runs
MODES = ("process", "thread")


class InferenceServer:
    """Batches the observations of many clients into one forward pass of a policy, in a process of its own.

    Args:
        policy: the policy (a ``TensorDictModule``, an ``nn.Module`` taking the observation, or a callable on
            TensorDicts). The server runs a copy of it (sent to the server process with cloudpickle, or
            ``copy.deepcopy`` in thread mode; moved to ``device``); the original stays the caller's, to train.
        policy_factory: a zero-argument callable building the server's policy instead of ``policy`` (called in the
            server process).
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
        mode: ``"process"`` (default): the server's loop runs in a process of its own, with its own GIL (it costs
            a process start, about a second, and a copy of each :meth:`infer` call's tensors); ``"thread"``: in a
            thread of this process, sharing the trainer's GIL (see the module's notes).
        num_threads: torch threads of the server process (default: this process's ``torch.get_num_threads()``).
        passes_in_flight: forward passes that may run at once, each in a thread of the server's with its own CUDA
            stream and page-locked buffers on a GPU: gathering and copying one overlaps the forward of another,
            and no request waits for every other pass to end (see :mod:`acollect.inference._passes`).

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
        mode: str = "process",
        num_threads: int | None = None,
        passes_in_flight: int = 2,
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
            # A bare "cuda" is the device current here and now, not the one current on the pass threads later.
            self.device = with_index(torch.device(device)) if device is not None else None
        except (TypeError, RuntimeError) as exc:
            raise ConfigurationError.bad_value("device", device, "a torch device or None") from exc
        if address is not None and not (isinstance(address, str) and address.startswith(("ipc", "tcp://"))):
            raise ConfigurationError.bad_value(
                "address", address, "None, 'ipc', 'ipc://<path>' or 'tcp://<host>[:<port>]'"
            )
        self._keys = as_server_keys("keys", keys)
        if self._keys is not None and address is None:
            raise ConfigurationError.bad_value(
                "keys", keys, "None when address is None (keys guard the connections of worker processes)"
            )
        if mode not in MODES:
            raise ConfigurationError.bad_value("mode", mode, f"one of {MODES}")
        self.mode = mode
        threads = check_int("num_threads", num_threads, minimum=1, optional=True)
        in_flight = check_int("passes_in_flight", passes_in_flight, minimum=1)
        self.hang_timeout = check_seconds("hang_timeout", hang_timeout, optional=True)
        self._policy_arg = policy
        self._spec = ServerSpec(
            policy=policy,
            policy_factory=policy_factory,
            max_batch_size=self.max_batch_size,
            max_wait=self.max_wait,
            device=self.device,
            exploration=parse_exploration_type(exploration_type),
            address=address,
            keys=self._keys,
            slots=bool(slots),
            num_threads=threads or torch.get_num_threads(),
            passes_in_flight=in_flight,
        )
        self._initial_version = 0
        self._sources: int | None = None
        self._host: LoopThread | LoopProcess | None = None
        self._calls = LocalCalls()  # this process's infer() and weight updates, each waiting for its answer
        self._tasks: TaskOwner | None = None
        self._own_tasks = False
        self._scopes: list[anyio.CancelScope] = []
        self._lifecycle = Lifecycle()  # the collectors' state machine: NEW, STARTING, RUNNING, BROKEN, CLOSED

    # -- life ----------------------------------------------------------------------------------
    @property
    def address(self) -> str | None:
        """Where worker processes connect (the real path or port), once started with an ``address``."""
        return self._host.address if self._host is not None else None

    @property
    def slot_address(self) -> str | None:
        """Where same-host workers hand over their shared-memory slots (``None``: messages only)."""
        return self._host.slot_address if self._host is not None else None

    @property
    def pid(self) -> int | None:
        """The server process's id (``mode="process"``, once started); ``None`` in thread mode."""
        return self._host.pid if isinstance(self._host, LoopProcess) else None

    @property
    def policy_device(self) -> torch.device | None:
        """Where the server's copy of the policy is, once started: the device of its weights (for a policy without
        any, the device its forward pass runs on), as the server process (or thread) found it after building it.

        ``device`` is what was asked for (``None``: let the policy say); this is what came of it.
        """
        return self._host.policy_device if self._host is not None else None

    @property
    def secure(self) -> bool:
        """Whether connections to :attr:`address` are encrypted and authenticated (``keys=``)."""
        return self._keys is not None

    @property
    def rejected_peers(self) -> int:
        """Connection attempts refused by the server's CURVE keys (a key not on the allow-list, no CURVE, a
        wrong server key); each attempt of a peer that keeps retrying counts. ``0`` without ``keys``."""
        return self._host.rejected_peers if self._host is not None else 0

    def local_client_keys(self) -> ClientKeys:
        """A fresh key pair the server accepts, for worker processes its owner starts (handed over privately).

        In process mode the server takes the key from its next command on: ``await`` :meth:`flush` before a client
        connects with it.

        Raises:
            CollectorStateError: the server has no keys, or is not started yet.
        """
        host = self._host
        if self._keys is None or host is None or not self._lifecycle.set_up:
            raise CollectorStateError("local_client_keys() needs a started inference server with keys")
        return host.local_client_keys(self._keys.public)

    async def flush(self) -> None:
        """Returns once the server has taken every command given before (keys, batch sizes, sources)."""
        self._check_running("flush()")
        assert self._host is not None
        await self._host.flush()

    def hung_error(self, timeout: float | None = None) -> PolicyError | None:
        """The error of a hung server (a :class:`~acollect.errors.PolicyError` naming it, how long the pass has run
        and the timeout) if a forward pass has run longer than ``timeout`` (default ``hang_timeout``), else ``None``."""
        limit = self.hang_timeout if timeout is None else timeout
        host = self._host
        if limit is None or host is None:
            return None
        started = host.recorder.pass_started
        ran = time.monotonic() - started if started is not None else 0.0
        if started is None or ran <= limit:
            return None
        where = f" at {host.address}" if host.address is not None else ""
        return PolicyError(
            f"the inference server{where} is hung: a forward pass has run for {ran:.1f}s (timeout {limit:g}s): "
            "the policy's forward has not returned"
        )

    def failure_now(self) -> InferenceServerError | None:
        """The server's own end if it has ended (a server process that died, or failed: an
        :class:`~acollect.errors.InferencePolicyError` where its policy raised), else ``None``: what a collector
        reports instead of its workers' view of it (they only see their connection close)."""
        host = self._host
        return host.failure_now() if host is not None else None

    @property
    def version(self) -> int:
        """Version of the weights the next forward pass runs with."""
        host = self._host
        return int(host.recorder.version) if host is not None else self._initial_version

    @version.setter
    def version(self, value: int) -> None:
        self._initial_version = check_int("version", value)
        if self._host is not None:  # the stats array: the server's loop reads it at its next pass, in any process
            self._host.recorder.version = self._initial_version

    @property
    def running(self) -> bool:
        """Whether the server answers requests."""
        return self._lifecycle.state is CollectorState.RUNNING

    def set_max_batch_size(self, value: int) -> None:
        """Changes ``max_batch_size`` (from the next forward pass on)."""
        self.max_batch_size = self._spec.max_batch_size = check_int("max_batch_size", value, minimum=1)
        if self._host is not None:
            self._host.configure(max_batch_size=self.max_batch_size)

    def expect_sources(self, sources: int | None) -> None:
        """Runs a pass as soon as this many distinct remote clients (worker processes) all wait."""
        self._sources = sources
        if self._host is not None:
            self._host.configure(sources=sources)

    async def __aenter__(self) -> InferenceServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.async_shutdown()

    async def start(self, tasks: TaskOwner | None = None) -> None:
        """Builds the inference copy of the policy, binds ``address`` and starts serving (a process or a thread).

        Args:
            tasks: the task group to run in (a collector's); ``None``: the server's own.
        """
        if self._lifecycle.state is not CollectorState.NEW:
            raise CollectorStateError(f"an inference server starts once (it is {self._lifecycle.state.value})")
        self._lifecycle.move(CollectorState.STARTING)
        host = self._host = (LoopThread if self.mode == "thread" else LoopProcess)(self._spec, self._initial_version)
        if tasks is None:
            tasks = TaskOwner("InferenceServer", on_failure=self._fail, on_loop_end=self._on_loop_end)
            self._tasks, self._own_tasks = tasks, True  # before any await: a cancelled start still closes it
            tasks.ensure_group()
            await tasks.started()
        self._tasks = tasks
        try:
            self._scopes = await host.start(tasks, self._calls.answered)
        except BaseException:
            # Nothing half-built is kept: no process, socket, slot listener or segment (a failed policy build or a
            # cancelled start); async_shutdown() is still the way out of STARTING.
            with anyio.CancelScope(shield=True):
                await host.close(0.0)
            raise
        if self._sources is not None:
            host.configure(sources=self._sources)
        self._lifecycle.setup_finished()
        if self.hang_timeout is not None:
            self._scopes.append(tasks.spawn(self._watch, self.hang_timeout, name="inference-liveness"))

    async def async_shutdown(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        """Stops serving, answers every waiting caller with an error and frees the sockets (and the server process:
        asked to stop, killed after ``timeout``). Idempotent.

        Args:
            timeout: seconds to wait for the server (and the server's own tasks) to end.
        """
        lifecycle = self._lifecycle
        if lifecycle.closing:
            return
        owner = self._tasks.loop if self._tasks is not None else None
        if owner is not None and not owner.is_current() and owner.ended:
            self.abandon(CloseReason.SHUTDOWN)  # nothing of it can be awaited on another loop
            return
        # A broken server (failed, died, hung) has nothing left to finish: a server process is killed at once.
        grace = 0.0 if lifecycle.failure is not None else timeout
        lifecycle.move(CollectorState.CLOSING)
        try:
            with anyio.CancelScope(shield=True):
                for scope in self._scopes:
                    scope.cancel()
                if self._host is not None:
                    await self._host.close(grace if isinstance(self._host, LoopProcess) else timeout)
                if self._own_tasks and self._tasks is not None:
                    await self._tasks.aclose(timeout)
                self._calls.wake_all()  # their requests have no outputs: the callers raise that the server closed
        finally:
            lifecycle.move(CollectorState.CLOSED)

    def abandon(self, reason: CloseReason = CloseReason.LOOP_ENDED) -> None:
        """Stops serving and frees everything now, without waiting (the server process is killed): for an owner
        whose event loop ended, or that is garbage collected. Idempotent."""
        lifecycle = self._lifecycle
        if lifecycle.state is CollectorState.CLOSED:
            return
        if not lifecycle.closing:
            lifecycle.move(CollectorState.CLOSING, reason=reason)
        try:
            if self._host is not None:
                self._host.abandon()
        finally:
            lifecycle.move(CollectorState.CLOSED)

    def _on_loop_end(self) -> None:
        held = self._lifecycle.state is not CollectorState.NEW
        self.abandon()
        if held:
            warn_unclosed(
                self,
                "InferenceServer was never shut down: the event loop it started on ended; its process "
                "was killed. Use `async with InferenceServer(...)` or `await server.async_shutdown()`",
            )

    async def aclose(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        """An alias of :meth:`async_shutdown`, for code that closes async resources with ``aclose()``."""
        await self.async_shutdown(timeout)

    def _fail(self, exc: BaseException) -> None:
        if self._lifecycle.failure is None and not self._lifecycle.closing:
            self._lifecycle.move(CollectorState.BROKEN, failure=exc)
        self._calls.wake_all()

    def _check_running(self, what: str) -> None:
        tasks = self._tasks
        if tasks is not None and tasks.loop is not None and not tasks.loop.is_current() and current_backend():
            raise CollectorStateError(
                f"{what}: this inference server belongs to the event loop it started on ({tasks.loop!r}), not to the "
                "one running now: use it inside the asyncio.run() (or trio.run()) that started it"
            )
        failure = self._lifecycle.failure
        if failure is not None:
            first = str(failure).split("\n", 1)[0]
            raise CollectorStateError(f"{what}: the inference server failed ({first})") from failure
        state = self._lifecycle.state
        if state is not CollectorState.RUNNING:
            raise CollectorStateError(
                f"{what}: the inference server is not running (it is {state.value}; use "
                "`async with InferenceServer(...)` or `await server.start()`)"
            )

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

        Observations on a GPU are brought to the host first (their copy waited for off the event loop: the passes
        gather every request in host memory), and the outputs set on the device they came from.
        """
        self._check_running("infer()")
        assert self._host is not None
        return await self._calls.infer(self._host, td, self._check_running)

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
        host = self._host
        assert host is not None
        checked = check_weights(as_weights(source), host.structure, what="the server's policy")
        return await self._calls.update_weights(host, checked, self._check_running)

    def stats(self) -> InferenceStats:
        """Forward passes, batch sizes and their fill rate, latency (see :class:`InferenceStats`)."""
        host = self._host
        if host is None:
            return ServerStatsRecorder(self.max_batch_size).snapshot(0)
        return host.recorder.snapshot(host.rejected_peers)

    async def _watch(self, timeout: float) -> None:
        """Fails the server once a forward pass has run longer than ``timeout``: callers learn the server is
        hung, rather than waiting for ever (or blaming the clients that wait on it)."""
        period = min(1.0, timeout / 4)
        while True:
            await anyio.sleep(period)
            error = self.hung_error()
            if error is not None:
                raise error
