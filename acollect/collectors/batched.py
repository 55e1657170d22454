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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from tensordict import TensorDictBase
from typing_extensions import Unpack

from acollect._affinity import pin_process
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.collector_settings import BatchedSettings
from acollect.collectors.options import WorkerSettings, parse
from acollect.errors import CollectorStateError, ConfigurationError, WorkerError, WorkerTimeoutError
from acollect.inference import InferenceServer
from acollect.inference.client import VERSION_KEY
from acollect.policy import PolicyLike
from acollect.pool import Received
from acollect.stats import CollectorStats
from acollect.weights import WeightUpdate

if TYPE_CHECKING:  # generated from the declarations, and only for mypy: regenerating it needs no import of it
    from acollect.collectors.option_types import BatchedOptions

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
        frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part
            from each (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or
            worker. Rounded up to a multiple of the number of envs, so that every env steps equally often (with a
            warning): ``collector.frames_per_batch`` then says what each batch holds,
            ``collector.requested_frames_per_batch`` what was asked. Required.
        total_frames (int): frames to collect in all, after which iteration ends; ``-1`` collects forever. Defaults to
            ``-1``.
        max_batch_size (int | None): the most observations in one forward pass (``None``: every env of every worker).
            Defaults to ``None``.
        max_wait (float): seconds a waiting observation may wait for others to join its forward pass; a pass runs at
            once when every worker is waiting. Defaults to ``0.002``.
        env_groups (int | None): each worker builds its envs as this many groups (from the env factory, with
            ``num_envs`` shared out among them) and steps one group while the others wait for their actions, hiding the
            round trip to the server: a worker never idles while a pass runs, and a pass takes the requests of every
            group that waits. ``1`` steps every env together (a worker waits for each pass). ``None`` picks what
            measured best (``docs/central-inference.md``): 4 with a policy on a GPU (a pass frees the CPU: the workers
            step while it runs); on a CPU, 2 where a core is left for the server beside the workers, else 1 (the
            server's pass needs the core the groups would step on), and one group where groups do not apply. A count
            given by name where they cannot apply (``env_kwargs`` without ``num_envs`` of at least that many, coroutine
            envs, ``init_random_frames``) is refused with the reason. Batches keep their layout. Defaults to ``None``.
        passes_in_flight (int | None): forward passes the server may run at once, each in a thread of its own (with its
            own CUDA stream and page-locked buffers on a GPU): requests gather into the next pass while one runs, and no
            worker waits for every other pass to end. ``None``: 2 on a GPU, 1 on a CPU (where passes at once only share
            the same cores; one pass at a time on a CPU runs in the server's loop thread, saving two thread hand-offs a
            pass). Defaults to ``None``.
        server_threads (int | None): torch threads of the server process (its copies and, on CPU, its forward passes);
            ``None``: the cores this process may use beyond one per worker, at least 1. More threads than free cores
            make every pass wait for descheduled threads. Defaults to ``None``.
        server (str): where the inference server's loop runs: ``"process"``, a process of its own, owned like a worker
            (its crash or hang breaks the collector within about a second, with its exit code or traceback), so that no
            step waits for the trainer's GIL; ``"thread"``, a thread of this process: no process to start, but every
            pass shares the trainer's GIL (the trainer's Python code and the workers' steps wait for each other).
            Defaults to ``'process'``.
        credits (int): batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory
            stays bounded. Defaults to ``2``.
        max_policy_lag (int | None): the most policy versions a batch may be behind the collector's when it is handed
            out: a batch with a frame chosen by an older version is dropped (counted in ``stats().stale_batches``), its
            memory given back, and the next one taken; its worker's stream goes on with its next batch. ``None``: no
            limit (``stats().policy_lag`` says how far behind each batch was). Defaults to ``None``.
        policy_factory (Callable[[], PolicyLike] | str | None): a zero-argument callable building the server's policy,
            instead of ``policy``, in the server process. Defaults to ``None``.
        device (Devices): the inference server's device, where the policy runs (default: where its parameters are); one
            device. The envs' device is ``env_device``. Defaults to ``None``.
        env_device (Devices): where env data lives; the multi-process collectors take a list too, with one device per
            worker. Defaults to ``None``.
        policy_device (Devices): the same as ``device`` (give one of the two). Defaults to ``None``.
        storing_device (Devices): where batches land (the workers' envs make them, not the inference device); one
            device, or a list with one per worker. Defaults to ``'cpu'``.
        max_frames_per_traj (int | None): truncate (``truncated=True``) and reset trajectories longer than this;
            ``None``: no limit. Defaults to ``None``.
        init_random_frames (int | None): act randomly for this many frames first (``None``: 0). Defaults to ``0``.
        reset_at_each_iter (bool): reset every env at the start of each batch. Defaults to ``False``.
        env_errors (str): what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector
            with it (from a worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env
            from its factory (a vector env whole), where it runs (a worker process stays up), ends the episodes in
            flight as truncated at their last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the
            failed step yields no frame, and the next frames start new trajectories from a reset), counts it in
            ``stats().env_restarts`` and logs a warning with the exception on the ``acollect`` logger. An env that fails
            again after 3 rebuilds in a row with no step taken between them (its factory raises, or it raises before its
            first step each time) breaks the collector with its last exception. ``"restart"`` needs an env factory or a
            gymnasium id (not an env instance); the coroutine envs of an ``AsyncEnvPool`` are rebuilt one by one, by the
            pool, each ending its own episode. Defaults to ``'raise'``.
        postproc (Callable[[TensorDictBase], TensorDictBase] | None): a callable applied to each batch before it is
            handed out, in this process (in the collection thread, for ``Collector``). Defaults to ``None``.
        split_trajs (bool): hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of
            ``[n_envs, T]`` batches. Defaults to ``False``.
        trajs_per_batch (int | None): hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the
            longest, with a boolean ``("collector", "mask")`` (True on real frames), in the order they ended. Workers
            still collect ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames
            collected; when they are reached, the episodes in progress are handed out cut, truncated at their last frame
            (the last batch may hold fewer than N). ``None``: ``[n_envs, T]`` batches. Defaults to ``None``.
        exploration_type (InteractionType | str | None): tensordict interaction type used while collecting (an
            ``InteractionType`` or its name, such as ``"mode"``); set per collection thread and per worker, so
            collectors never change each other's. Defaults to ``InteractionType.RANDOM``.
        env_kwargs (Mapping[str, Any] | None): keyword arguments of the env factory, or of the env a gymnasium id names
            (such as ``{"num_envs": 8}``). Defaults to ``{}``.
        progress (bool | str): show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm
            bar if tqdm is installed, else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``,
            ``"log"`` or ``False`` (nothing shown). Workers count their episodes and send them with each batch. Defaults
            to ``False``.
        collector_kwargs (Mapping[str, Any] | Sequence[Mapping[str, Any]] | None): options per worker: one dict for
            every worker, or a list of dicts with one per worker, among ``device``, ``env_device``, ``env_errors``,
            ``env_kwargs``, ``exploration_type``, ``init_random_frames``, ``max_frames_per_traj``, ``num_threads``,
            ``policy_device``, ``reset_at_each_iter``, ``storing_device``. Defaults to ``None``.
        update_after_each_batch (bool): push the weights of ``policy`` (this process's copy) after every batch. Defaults
            to ``False``.
        max_weight_update_interval (int | None): push the weights of ``policy`` at least every this many batches
            (``None``: when asked only). Defaults to ``None``.
        weight_sync_schemes (Mapping[str, WeightSyncScheme] | None): how each model's weights travel: model id ->
            ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()`` (default: through shared memory to workers on
            this host, else over the endpoint). Defaults to ``{}``.
        max_worker_restarts (int): restarts allowed per worker; ``0`` raises on the first crash. Defaults to ``0``.
        on_worker_loss (str): what a worker lost for good does to the collector (one that dies with its
            ``max_worker_restarts`` spent, or a worker started by hand that leaves and is not replaced): ``"raise"``
            breaks the collector with the worker's error; ``"continue"`` drops the worker (a warning on the
            ``"acollect"`` logger, ``stats().lost_workers``, its state ``LOST``) and collects on with the others, a
            lockstep batch then holding the live workers' parts only; the collector breaks when no worker is left. It
            applies once every worker started. Defaults to ``'raise'``.
        heartbeat_timeout (float): seconds a collecting worker may make no env step (or any worker send no heartbeat)
            before it counts as hung; a worker with no parent process to watch (started by hand, or on another host)
            exits after as long without a word from its collector. A forward pass running longer breaks the collector
            with a ``PolicyError`` saying the server is hung. Defaults to ``30.0``.
        startup_timeout (float): seconds a worker may take to start and build its env and policy (or to join, for one
            started by hand). Defaults to ``120.0``.
        shutdown_timeout (float): seconds :meth:`async_shutdown` takes at most, unless it is given a timeout. Defaults
            to ``5.0``.
        address (str | None): ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which
            workers connect to (``None``: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's
            address>:<free port>``). Defaults to ``None``.
        start_method (str): how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
            Defaults to ``'spawn'``.
        launcher (Any): where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each),
            ``"submitit"`` (one submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)``
            (see ``acollect.launchers``); checked together with ``start_method``. Defaults to ``'local'``.
        num_threads (int): torch threads in each worker. Defaults to ``1``.
        use_shared_memory (bool | None): move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or
            more on a local address). Defaults to ``None``.
        remote_workers (int): how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys
            DIR``, on any machine) instead of by the collector: the last ones. The collector waits up to
            ``startup_timeout`` for them to join. Needs ``address`` and ``keys``. Defaults to ``0``.
        keys (ServerKeys | str | os.PathLike[str] | None): a key directory written by ``acollect keys`` (or a
            ``ServerKeys``): the endpoint then encrypts every connection with CURVE and accepts only the workers whose
            public key is in its ``authorized/`` directory; others are refused and counted in ``rejected_peers``. They
            guard the inference server's connections as well (the same key pair and allow-list). Defaults to ``None``.
        copy_batches (bool): ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and
            never written while any tensor of it is held (a view, a slice, a numpy array of one), then given back to its
            worker (see ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once. Defaults to
            ``False``.
        max_lent_bytes (int | None): the most shared memory lent to the caller at once, in bytes: beyond it a batch is
            handed out as a copy (its memory given back at once), so a caller keeping every batch never stalls
            collection. ``None``: 1 GiB, or a quarter of ``/dev/shm`` where that is less. Defaults to ``None``.
        filter_worker_warnings (bool): ignore Python warnings inside the workers (an env's deprecation warnings,
            repeated by every worker, would drown the trainer's output); ``False`` lets them through to the workers'
            stderr. Defaults to ``True``.
        num_workers (int | None): the number of workers where ``create_env_fn_list`` is one factory (default: the CPU
            count). Defaults to ``None``.
        worker_affinity (str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None): the cores each worker
            process runs on (Linux; refused where ``os.sched_setaffinity`` is missing, such as macOS). ``None``
            (default): nothing is pinned, the OS places every process. ``"auto"``: worker ``i`` gets the ``i``-th core
            this process may use (``os.sched_getaffinity(0)`` at construction, round-robin when there are more workers
            than cores) and the trainer's threads the cores left, given back as they were at shutdown; with no core left
            (as many workers as cores), the trainer stays unpinned. A list places the workers by hand, one non-empty set
            of core ids per worker (``[{0}, {1}, {2, 3}]``), and leaves the trainer alone. Each worker pins itself at
            its start, before it builds its env (whose threads inherit the cores), and runs as many torch threads as it
            has cores, in place of ``num_threads``. Workers must run on this host (``launcher='local'``, no
            ``remote_workers``). With ``"auto"`` the inference server process runs on the trainer's cores (those left by
            the workers), pinned once it started, and ``server_threads`` defaults to their number; with no core left, or
            with a list, the server is not pinned. Defaults to ``None``.

    Raises:
        ConfigurationError: a bad argument (named in the message).
    """

    settings_class: ClassVar[type[BatchedSettings]] = BatchedSettings
    settings: BatchedSettings

    def __init__(self, create_env_fn: Any, policy: PolicyLike = None, **options: Unpack[BatchedOptions]) -> None:
        settings = parse(options, self.settings_class, owner=type(self))
        if policy is None and settings.policy_factory is None:
            raise ConfigurationError.bad_value(
                "policy", None, "a policy (or a policy_factory): the inference server runs it for every worker"
            )
        _check_env_groups(settings, create_env_fn)
        self._server: InferenceServer | None = None
        self._server_rejected = 0
        self._final_inference: dict[str, Any] | None = None  # the server's figures at its end
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
            device=self.settings.inference_device,
            exploration_type=self.settings.exploration_type,
            address=self._server_address(),
            keys=self.settings.keys,
            # A forward pass that never returns is the server's hang, reported as such, not as hung workers.
            hang_timeout=self.settings.heartbeat_timeout,
            mode=self.settings.server,
            num_threads=self._server_threads(),
            passes_in_flight=self._passes_in_flight(),
        )
        server.version = self._initial_version
        self._server = server  # recorded first: a start cancelled half-way is closed by _teardown
        await server.start(self._tasks)
        for config in self._configs:
            config.inference = {
                "address": server.address,
                "slots": server.slot_address,
                "env_groups": self._env_groups(),
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
            server.set_max_batch_size(sum(h.n_envs for h in self._pool.handles))

    def _workers_lost(self, live: int) -> None:
        # A pass waits for every worker's request, or max_wait: a lost worker never asks again.
        if self._server is not None:
            self._server.expect_sources(live)

    def _on_gpu(self) -> bool:
        device = self.settings.inference_device
        return device is not None and torch.device(device).type == "cuda"

    def _env_groups(self) -> int:
        if self.settings.env_groups is not None:
            return self.settings.env_groups
        # docs/central-inference.md: while a group waits for its pass the worker steps the others, which pays where
        # the pass frees the CPU (a GPU) or has a core of its own; on a CPU the server needs the core otherwise.
        if self._on_gpu():
            return GPU_ENV_GROUPS
        return 2 if _cores() > self.num_workers + 1 else 1

    def _passes_in_flight(self) -> int:
        if self.settings.passes_in_flight is not None:
            return self.settings.passes_in_flight
        return 2 if self._on_gpu() else 1

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
        self._last_push = self._tally.batches
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
            "env_groups", wanted, f"None or 1 with init_random_frames={settings.init_random_frames}: the random "
            "warm-up steps every env together without the server, so env groups do not apply")  # fmt: skip
    n_envs = settings.env_kwargs.get("num_envs")
    if type(n_envs) is not int or n_envs < wanted:
        raise ConfigurationError.bad_value(
            "env_groups", wanted, f"at most the envs a worker builds, shared out through env_kwargs: the env factory "
            f"is called once per group with its share of env_kwargs['num_envs'], which is {n_envs!r}; pass "
            f"env_kwargs={{'num_envs': N}} with N >= {wanted}, or env_groups=None")  # fmt: skip
    factories = create_env_fn if isinstance(create_env_fn, Sequence) else [create_env_fn]
    if any(_makes_coroutine_envs(factory) for factory in factories):
        raise ConfigurationError.bad_value(
            "env_groups", wanted, "None or 1 with coroutine envs (AsyncEnvPool): each of their envs already steps "
            "while the others wait for their actions, so they are never split into groups")  # fmt: skip


def _makes_coroutine_envs(factory: Any) -> bool:
    """Whether ``factory`` is, by its type alone, a coroutine env class (or a partial of one); a plain function
    is only known once called, in the worker, which refuses it there."""
    from acollect.envs.async_pool import AsyncEnvPool

    while isinstance(factory, functools.partial):
        factory = factory.func
    return isinstance(factory, type) and issubclass(factory, AsyncEnvPool)
