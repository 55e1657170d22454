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
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from typing_extensions import Unpack

from acollect._validate import check_int, check_seconds
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.dispatch import FirstReady
from acollect.collectors.options import WorkerOptions, WorkerSettings
from acollect.errors import CollectorStateError, ConfigurationError, WorkerError, WorkerTimeoutError
from acollect.inference import InferenceServer
from acollect.inference.client import VERSION_KEY
from acollect.inference.server import MODES
from acollect.policy import PolicyLike
from acollect.pool import Received
from acollect.stats import CollectorStats
from acollect.weights import WeightUpdate

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
        policy_factory (callable | None): builds the server's policy instead of ``policy`` (in the server process).
        max_batch_size (int | None): the most observations in one forward pass (default: every env of every
            worker).
        max_wait (float): seconds a waiting observation may wait for others to join its forward pass (default
            0.002). A pass runs at once when every worker is waiting.
        device (device | None): where the policy runs (default: where its parameters are).
        credits (int): batches each worker may collect ahead of the trainer (default 2).
        env_groups (int | None): each worker builds its envs as this many groups (from the env factory, with
            ``num_envs`` shared out among them) and steps one group while the others wait for their actions,
            hiding the round trip to the server: a worker never idles while a pass runs, and a pass takes the
            requests of every group that waits. ``1`` steps every env together (a worker waits for each pass).
            ``None`` (the default) picks what measured best (``docs/central-inference.md``): 4 with a policy on a
            GPU (a pass frees the CPU: the workers step while it runs); on a CPU, 2 where a core is left for the
            server beside the workers, else 1 (the server's pass needs the core the groups would step on).
            Applies where ``env_kwargs`` has ``num_envs >= 2`` and ``init_random_frames`` is 0; batches keep
            their layout.
        passes_in_flight (int | None): forward passes the server may run at once, each in a thread of its own
            (with its own CUDA stream and page-locked buffers on a GPU): requests gather into the next pass while
            one runs, and no worker waits for every other pass to end. ``None`` (the default): 2 on a GPU, 1 on a
            CPU (where passes at once only share the same cores).
        server_threads (int | None): torch threads of the server process (its copies and, on CPU, its forward
            passes); default: the cores this process may use beyond one per worker, at least 1. More threads
            than free cores make every pass wait for descheduled threads.
        server (str): where the inference server's loop runs: ``"process"`` (default), a process of its own, owned
            like a worker (its crash or hang breaks the collector within about a second, with its exit code or
            traceback), so that no step waits for the trainer's GIL; ``"thread"``, a thread of this process: no
            process to start, but every pass shares the trainer's GIL (the trainer's Python code and the
            workers' steps wait for each other).
        **options: the options of :class:`~acollect.MultiAsyncCollector` (``frames_per_batch``,
            ``total_frames``, ``num_workers``, ``env_device``, ``storing_device``, ``env_kwargs``, launchers,
            timeouts, ``copy_batches``, ``postproc``, ...), checked as there. ``policy_device`` means ``device``.
            ``keys`` guards the inference server's connections as well as the endpoint's (the same key pair and
            allow-list), and a forward pass running longer than ``heartbeat_timeout`` breaks the collector with a
            :class:`~acollect.errors.PolicyError` saying the server is hung.

    Raises:
        ConfigurationError: a bad argument (named in the message).
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        max_batch_size: int | None = None,
        max_wait: float = 0.002,
        credits: int = 2,
        env_groups: int | None = None,
        passes_in_flight: int | None = None,
        server_threads: int | None = None,
        server: str = "process",
        **options: Unpack[WorkerOptions],
    ) -> None:
        self.max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1, optional=True)
        self.max_wait = check_seconds("max_wait", max_wait, allow_zero=True)
        self.env_groups = check_int("env_groups", env_groups, minimum=1, optional=True)
        self.server_threads = check_int("server_threads", server_threads, minimum=1, optional=True)
        self.passes_in_flight = check_int("passes_in_flight", passes_in_flight, minimum=1, optional=True)
        if server not in MODES:
            raise ConfigurationError.bad_value("server", server, f"one of {MODES}")
        self.server_mode = server
        rest: dict[str, Any] = dict(options)
        device, policy_device = rest.pop("device", None), rest.pop("policy_device", None)
        if device is not None and policy_device is not None:
            raise ConfigurationError.bad_value(
                "policy_device", policy_device, "None when device is given (both name the inference device)"
            )
        self.device = policy_device if policy_device is not None else device
        if isinstance(self.device, (list, tuple)):
            raise ConfigurationError.bad_value("device", self.device, "one device: the inference server's")
        if policy is None and rest.get("policy_factory") is None:
            raise ConfigurationError.bad_value(
                "policy", None, "a policy (or a policy_factory): the inference server runs it for every worker"
            )
        if "storing_device" not in rest:
            rest["storing_device"] = "cpu"  # batches come from the workers' envs, not from the inference device
        self._server: InferenceServer | None = None
        self._server_rejected = 0
        self._final_inference: dict[str, Any] | None = None  # the server's figures at its end
        super().__init__(create_env_fn, policy, rest, dispatch=FirstReady(credits))
        if isinstance(self.settings.policy_factory, str):
            raise ConfigurationError.bad_value("policy_factory", self.settings.policy_factory, "a callable")

    def _worker_policy(self) -> tuple[Any, WorkerSettings]:
        # The workers get no policy: theirs is the server, which builds the policy (factory included) here.
        return None, dataclasses.replace(self.settings, policy_factory=None)

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
            max_batch_size=self.max_batch_size or 1 << 30,
            max_wait=self.max_wait,
            device=self.device,
            exploration_type=self.settings.exploration_type,
            address=self._server_address(),
            keys=self.settings.keys,
            # A forward pass that never returns is the server's hang, reported as such, not as hung workers.
            hang_timeout=self.settings.heartbeat_timeout,
            mode=self.server_mode,
            num_threads=self._server_threads(),
            passes_in_flight=self._passes_in_flight(),
        )
        server.version = self._initial_version
        self._server = server  # recorded first: a start cancelled half-way is closed by _teardown
        await server.start(self._tasks)
        for config in self._configs:
            config.inference = {
                "address": server.address, "slots": server.slot_address, "env_groups": self._env_groups()
            }
            if server.secure:  # a key pair of its own per worker slot, accepted in memory, as for the collector's
                config.inference["keys"] = server.local_client_keys()
        server.expect_sources(self.num_workers)
        await server.flush()  # the server process holds the workers' keys before any worker connects
        await super()._setup()
        if self.max_batch_size is None:
            assert self._pool is not None
            server.set_max_batch_size(sum(h.n_envs for h in self._pool.handles))

    def _on_gpu(self) -> bool:
        device = self.device
        return device is not None and torch.device(device).type == "cuda"

    def _env_groups(self) -> int:
        if self.env_groups is not None:
            return self.env_groups
        # docs/central-inference.md: while a group waits for its pass the worker steps the others, which pays where
        # the pass frees the CPU (a GPU) or has a core of its own; on a CPU the server needs the core otherwise.
        if self._on_gpu():
            return GPU_ENV_GROUPS
        return 2 if _cores() > self.num_workers + 1 else 1

    def _passes_in_flight(self) -> int:
        if self.passes_in_flight is not None:
            return self.passes_in_flight
        return 2 if self._on_gpu() else 1

    def _server_threads(self) -> int:
        if self.server_threads is not None:
            return self.server_threads
        return max(1, min(torch.get_num_threads(), _cores() - self.num_workers))

    async def _teardown(self) -> None:
        try:
            await super()._teardown()
        finally:
            server, self._server = self._server, None
            if server is not None:
                self._initial_version = server.version
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
        return self._server.version if self._server is not None else self._initial_version

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        """Copies the weights into the server's policy between two forward passes; every action chosen afterwards
        carries the new ``("collector", "policy_version")``."""
        self._check_usable("update_policy_weights_()")
        source: Any = update.policy_only(self._policy_arg, "the policy runs in the collector's inference server")
        with self._call("update_policy_weights_()"):
            await self._ensure_setup()
            return await self.server.update_policy_weights_(source)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved; the server's policy gets the saved weights before the next batch."""
        super().load_state_dict(state_dict)
        if self._server is not None:
            self._server.version = self._initial_version  # the restoring push brings it to the saved version

    async def _push(self, models: Mapping[str, TensorDictBase], ids: Sequence[int], limit: float) -> int:
        # Pushes the base class would send to every worker (restored state, update_after_each_batch) go to the server.
        if set(models) != {"policy"}:
            raise ConfigurationError.bad_value("model_id", sorted(models), "'policy' (the server's only model)")
        version = await self.server.update_policy_weights_(models["policy"])
        self._last_push = self._batches
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
