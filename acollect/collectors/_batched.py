"""AsyncBatchedCollector: env workers only step; one inference server runs the policy for all of them.

The workers are the same processes as :class:`~acollect.MultiAsyncCollector`'s (same launchers, same
rollout engine, same batch layout, crash and hang detection, credits), except that their policy is a
:class:`~acollect.inference.client.RemotePolicy`: at every step each worker sends its observations to
an :class:`~acollect.InferenceServer`, which runs one forward pass over the observations of every waiting
worker, on the trainer's device, in a process of its own (or, with ``server="thread"``, a thread of the
trainer's). Weight updates are one copy
into the server's inference copy of the policy, between two forward passes.

Examples:
    >>> import anyio, torch
    >>> from tensordict.nn import TensorDictModule
    >>> from acollect import AsyncBatchedCollector
    >>> from acollect.testing import CountingEnv
    >>> policy = TensorDictModule(lambda obs: (obs[..., 0] > 2).long(), in_keys=["observation"], out_keys=["action"])
    >>> async def main():
    ...     async with AsyncBatchedCollector([CountingEnv] * 2, policy, frames_per_batch=4, total_frames=8,
    ...                                      start_method="forkserver") as c:
    ...         return [tuple(b.shape) async for b in c]
    >>> anyio.run(main)
    [(1, 4), (1, 4)]
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._affinity import pin_process
from acollect._devices import check_device, module_device, with_index
from acollect._policy import PolicyLike
from acollect._weights.sync import WeightSyncScheme
from acollect._weights.updates import WeightUpdate
from acollect._workers.handles import Received
from acollect._workers.launcher import Launcher
from acollect.collectors._collector_settings import BatchedSettings
from acollect.collectors._keywords import keyword_errors, settings_from
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors._options import DEFAULT_START_METHOD, HEARTBEAT_TIMEOUT, Devices, Keys, WorkerSettings
from acollect.errors import CollectorStateError, ConfigurationError, WorkerError, WorkerTimeoutError
from acollect.inference import InferenceServer
from acollect.inference.client import VERSION_KEY
from acollect.stats import CollectorStats

__all__ = ["GPU_ENV_GROUPS", "AsyncBatchedCollector"]

#: env groups per worker when ``env_groups`` is not given and the policy runs on a GPU
GPU_ENV_GROUPS = 4


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class AsyncBatchedCollector(MultiCollectorBase):
    """Env worker processes and one batched forward pass in an inference server process: central inference.

    Each worker steps its envs and sends their observations to the collector's
    :class:`~acollect.InferenceServer`, which runs the policy once on the observations of all waiting workers
    (up to ``max_batch_size``, or whatever came within ``max_wait``) on ``device`` and sends the actions back.
    Batches are each worker's ``[n_envs, T]`` batch, first ready first served, as from
    :class:`~acollect.MultiAsyncCollector` (same keys, dtypes and layout), and every frame's
    ``("collector", "policy_version")`` is the version of the weights that chose its action.

    Choose it when the policy is large (a CNN on pixels, a wide MLP, a transformer), belongs on a GPU, or
    should not be copied into every worker; for a small MLP on CPU the policy in every worker
    (:class:`~acollect.MultiAsyncCollector`) saves the round trip per step.

    Args:
        create_env_fn: one env factory per worker (a list), or one factory for ``num_workers`` workers (each an
            env, a gymnasium id, or a callable returning a batched env).
        policy: the policy (``TensorDictModule``, ``nn.Module`` taking the observation, or a callable on
            TensorDicts). The server runs a copy of it on ``device``; this object stays yours to train, and
            :meth:`update_policy_weights_` copies its weights into the server's copy.

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.BatchedSettings` declares it.

    Raises:
        ConfigurationError: a bad argument (named in the message).
    """

    settings_class: ClassVar[type[BatchedSettings]] = BatchedSettings
    settings: BatchedSettings

    @keyword_errors()
    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_factory: Callable[[], PolicyLike] | str | None = None,
        device: Devices | None = None,
        env_device: Devices | None = None,
        policy_device: Devices | None = None,
        storing_device: Devices | None = "cpu",
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        env_errors: str = "raise",
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        trajs_per_batch: int | None = None,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        env_kwargs: Mapping[str, Any] | None = None,
        progress: bool | str = False,
        collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int | None = None,
        weight_sync_schemes: Mapping[str, WeightSyncScheme] | None = None,
        max_worker_restarts: int = 0,
        on_worker_loss: str = "raise",
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 5.0,
        address: str | None = None,
        start_method: str = DEFAULT_START_METHOD,
        launcher: str | Launcher = "local",
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Keys | None = None,
        copy_batches: bool = False,
        max_lent_bytes: int | None = None,
        cuda_dma: bool = False,
        filter_worker_warnings: bool = True,
        num_workers: int | None = None,
        worker_affinity: str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None = None,
        credits: int = 2,
        max_policy_lag: int | None = None,
        max_batch_size: int | None = None,
        max_wait: float = 0.002,
        env_groups: int | None = None,
        passes_in_flight: int | None = None,
        server_threads: int | None = None,
        server: str = "process",
    ) -> None:
        settings = settings_from(BatchedSettings, locals())
        if policy is None and settings.policy_factory is None:
            raise ConfigurationError.bad_value(
                "policy", None, "a policy (or a policy_factory): the inference server runs it for every worker"
            )
        _check_env_groups(settings, create_env_fn)
        self._server: InferenceServer | None = None
        self._server_rejected = 0
        self._final_inference: dict[str, Any] | None = None  # the server's figures at its end
        # Where the server runs, settled once here: given (a bare "cuda" is the device current now), else where the
        # policy's parameters are, so that the GPU defaults below do not depend on how the device was given.
        # (None: a policy_factory with no device, built in the server: the CPU defaults.)
        given = settings.inference_device
        self._device = with_index(check_device("device", given) if given is not None else module_device(policy))
        super().__init__(create_env_fn, policy, settings)

    def _worker_policy(self) -> tuple[Any, WorkerSettings]:
        # The workers get no policy: theirs is the server, which builds the policy (factory included) here, on
        # the device that device and policy_device name.
        return None, dataclasses.replace(self.settings, policy_factory=None, device=None, policy_device=None)

    def _server_address(self) -> str:
        if self.settings.address is not None and self.settings.address.startswith("tcp://"):
            return self.settings.address.rsplit(":", 1)[0]  # the collector's host, a free port
        if self.settings.launcher.same_host:
            return "ipc"
        address = self.settings.launcher.default_address()
        assert address is not None
        return address

    # -- lifecycle -----------------------------------------------------------------------------
    async def _setup(self) -> None:
        factory = self.settings.policy_factory
        server = InferenceServer(
            self._policy_arg,
            policy_factory=factory if callable(factory) else None,
            max_batch_size=self.settings.max_batch_size or 1 << 30,
            max_wait=self.settings.max_wait,
            device=self._device,
            exploration_type=self.settings.exploration_type,
            address=self._server_address(),
            keys=self.settings.keys,
            # A forward pass that never returns is the server's hang, reported as such, not as hung workers.
            hang_timeout=self.settings.heartbeat_timeout,
            mode=self.settings.server,
            num_threads=self._server_threads(),
            passes_in_flight=self.passes_in_flight,
        )
        server.version = self._worker_changes.initial_version
        self._server = server  # recorded first: a start cancelled half-way is closed by _teardown
        await server.start(self._tasks)
        for config in self._configs:
            config.inference = {
                "address": server.address,
                "slots": server.slot_address,
                "env_groups": self.env_groups,
                # Asked for by name: a worker that finds it cannot apply (coroutine envs) says so.
                "env_groups_required": self.settings.env_groups is not None and self.settings.env_groups > 1,
            }
            if server.secure:  # a key pair of its own per worker slot, accepted in memory, as for the collector's
                config.inference["keys"] = server.local_client_keys()
        server.expect_sources(self.num_workers)
        await server.flush()  # the server process holds the workers' keys before any worker connects
        await super()._setup()
        cores = self.trainer_cores
        if cores is not None and server.pid is not None:
            # worker_affinity="auto": the server process shares the trainer's cores, off the workers' (its threads
            # started so far are pinned with it; those it starts later inherit their creator's cores).
            pin_process(server.pid, cores)
        if self.settings.max_batch_size is None:
            assert self._pool is not None
            server.set_max_batch_size(sum(h.hello.n_envs for h in self._pool.handles))

    def _lost(self, live: int) -> None:
        super()._lost(live)
        # A pass waits for every worker's request, or max_wait: a lost worker never asks again.
        if self._server is not None:
            self._server.expect_sources(live)

    def _on_gpu(self) -> bool:
        return self._device is not None and self._device.type == "cuda"

    @property
    def env_groups(self) -> int:
        """The env groups each worker steps in turn (``env_groups``, or its default: 4 where the server runs on a
        GPU, whether ``device`` names it or the policy's parameters are there; on a CPU 2 where a core is spare,
        else 1).

        Examples:
            >>> from acollect.testing import CountingEnv, Doubler
            >>> AsyncBatchedCollector([CountingEnv], Doubler(), frames_per_batch=8, env_groups=1).env_groups
            1
        """
        if self.settings.env_groups is not None:
            return self.settings.env_groups
        # docs/central-inference.md: while a group waits for its pass the worker steps the others, which pays where
        # the pass frees the CPU (a GPU) or has a core of its own; on a CPU the server needs the core otherwise.
        if self._on_gpu():
            return GPU_ENV_GROUPS
        return 2 if _cores() > self.num_workers + 1 else 1

    @property
    def passes_in_flight(self) -> int:
        """Forward passes the server may run at once (``passes_in_flight``, or its default: one per env group on a
        GPU, 1 on a CPU).

        Examples:
            >>> from acollect.testing import CountingEnv, Doubler
            >>> AsyncBatchedCollector([CountingEnv], Doubler(), frames_per_batch=8, device="cpu").passes_in_flight
            1
        """
        if self.settings.passes_in_flight is not None:
            return self.settings.passes_in_flight
        # On a GPU, one pass in flight per env group of a worker: a group's pass never queues behind another's
        # (docs/central-inference.md: 0.60x against 0.54x with 2, 1 worker x 8 Pong envs, the 2 ms stand-in).
        return GPU_ENV_GROUPS if self._on_gpu() else 1

    def _server_threads(self) -> int:
        if self.settings.server_threads is not None:
            return self.settings.server_threads
        return max(1, min(torch.get_num_threads(), _cores() - self.num_workers))

    async def _teardown(self) -> None:
        try:
            await super()._teardown()
        finally:
            server, self._server = self._server, None
            if server is not None:
                self._worker_changes.keep_version(server.version)
                # A broken collector's server has nothing to finish (it may be the hung part): no grace.
                await server.async_shutdown(0.0 if self._lifecycle.failure is not None else 10.0)
                self._server_rejected += server.rejected_peers
                self._final_inference = server.stats().as_dict()  # stats() after the end shows its last figures

    def _release_now(self) -> None:
        try:
            super()._release_now()
        finally:
            server, self._server = self._server, None
            if server is not None:
                server.abandon()

    def _fail(self, exc: BaseException) -> None:
        # Workers waiting for actions make no env step: while a forward pass hangs, the pool's liveness check may
        # see them hung before the server's own check fires. The server is what hangs: say so.
        server = self._server
        if isinstance(exc, WorkerTimeoutError) and server is not None:
            hung = server.hung_error(timeout=self.settings.heartbeat_timeout / 2)
            if hung is not None:
                exc = hung
        # A server process that died closes every worker's connection: report its end, not theirs.
        ended = server.failure_now() if server is not None and isinstance(exc, WorkerError) else None
        super()._fail(ended if ended is not None else exc)

    @property
    def rejected_peers(self) -> int:
        """Connection attempts refused by the CURVE keys, at the collector's endpoint and at its inference server
        (a key not on the allow-list, no CURVE, a wrong collector key). ``0`` without ``keys``."""
        server = self._server
        return super().rejected_peers + self._server_rejected + (server.rejected_peers if server is not None else 0)

    @property
    def server(self) -> InferenceServer:
        """The inference server (while the collector runs)."""
        if self._server is None:
            raise CollectorStateError("the collector's inference server is not running")
        return self._server

    # -- weights -------------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """Version of the weights the server's next forward pass runs with."""
        return self._server.version if self._server is not None else self._worker_changes.initial_version

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        """Copies the weights into the server's policy between two forward passes; every action chosen afterwards
        carries the new ``("collector", "policy_version")``."""
        self._calls.check_usable("update_policy_weights_()")
        source: Any = update.policy_only(self._policy_arg, "the policy runs in the collector's inference server")
        with self._calls.call("update_policy_weights_()"):
            await self._ensure_setup()
            return await self.server.update_policy_weights_(source)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved; the server's policy gets the saved weights before the next batch."""
        super().load_state_dict(state_dict)
        if self._server is not None:
            self._server.version = (
                self._worker_changes.initial_version
            )  # the restoring push brings it to the saved version

    async def _push(
        self, models: Mapping[str, TensorDictBase], ids: Sequence[int], limit: float, ready: tuple[Any, ...] = ()
    ) -> int:
        # The server records what the caller queued on its streams itself (update_policy_weights_ on this thread).
        # Pushes the base class would send to every worker (restored state, update_after_each_batch) go to the server.
        if set(models) != {"policy"}:
            raise ConfigurationError.bad_value("model_id", sorted(models), "'policy' (the server's only model)")
        version = await self.server.update_policy_weights_(models["policy"])
        self._worker_changes.pushed(self._counts.batches)
        return version

    # -- stats ---------------------------------------------------------------------------------
    def _batch_version(self, item: Received) -> int:
        # The server's weights change between two forward passes, mid-batch: each frame says which version chose
        # its action, while the worker's own header version never moves (its policy has no weights).
        versions = item.data.get(VERSION_KEY, None)
        if versions is None or versions.numel() == 0:
            return super()._batch_version(item)
        return int(versions.min())

    def stats(self) -> CollectorStats:
        """As for every collector, plus ``inference``: the server's passes, batch sizes, fill rate and latency."""
        stats = super().stats()
        inference = self._server.stats().as_dict() if self._server is not None else self._final_inference
        return stats if inference is None else dataclasses.replace(stats, inference=inference)


def _check_env_groups(settings: BatchedSettings, create_env_fn: Any) -> None:
    """Refuses an ``env_groups`` asked for by name that cannot apply, with the reason: never one group silently.

    (``None`` picks a count only where groups apply, and steps one group elsewhere.)
    """
    wanted = settings.env_groups
    if wanted is None or wanted < 2:
        return
    if settings.init_random_frames:
        raise ConfigurationError.bad_value(
            "env_groups",
            wanted,
            f"None or 1 with init_random_frames={settings.init_random_frames}: the random "
            "warm-up steps every env together without the server, so env groups do not apply",
        )
    n_envs = settings.env_kwargs.get("num_envs")
    if type(n_envs) is not int or n_envs < wanted:
        raise ConfigurationError.bad_value(
            "env_groups",
            wanted,
            f"at most the envs a worker builds, shared out through env_kwargs: the env factory "
            f"is called once per group with its share of env_kwargs['num_envs'], which is {n_envs!r}; pass "
            f"env_kwargs={{'num_envs': N}} with N >= {wanted}, or env_groups=None",
        )
    factories = create_env_fn if isinstance(create_env_fn, Sequence) else [create_env_fn]
    if any(_makes_coroutine_envs(factory) for factory in factories):
        raise ConfigurationError.bad_value(
            "env_groups",
            wanted,
            "None or 1 with coroutine envs (AsyncEnvPool): each of their envs already steps "
            "while the others wait for their actions, so they are never split into groups",
        )


def _makes_coroutine_envs(factory: Any) -> bool:
    """Whether ``factory`` is, by its type alone, a coroutine env class (or a partial of one); a plain function
    is only known once called, in the worker, which refuses it there."""
    from acollect.envs import AsyncEnvPool

    while isinstance(factory, functools.partial):
        factory = factory.func
    return isinstance(factory, type) and issubclass(factory, AsyncEnvPool)
