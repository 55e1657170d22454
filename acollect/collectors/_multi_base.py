"""What the multi-process collectors share: arguments, the worker pool, weights, seeds and state."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from acollect.collectors.base import CollectorBase
from acollect.devices import check_device
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.launchers.registry import resolve_launcher
from acollect.policy import PolicyLike, parse_exploration_type
from acollect.pool import Received, WorkerPool
from acollect.rollout import check_frames_per_batch
from acollect.stats import EpisodeSummary
from acollect.trajectories import split_trajectories
from acollect.transport.auth import ServerKeys
from acollect.transport.shm import shm_available
from acollect.transport.weight_sync import SharedMemWeightSyncScheme, WeightSyncScheme, ZmqWeightSyncScheme
from acollect.weights import as_weights, check_push
from acollect.worker import protocol as P
from acollect.worker.process import START_METHODS

__all__ = ["MultiCollectorBase"]

#: Options ``collector_kwargs`` may set per worker.
PER_WORKER_OPTIONS = frozenset({
    "device", "env_device", "policy_device", "storing_device", "max_frames_per_traj", "init_random_frames",
    "reset_at_each_iter", "exploration_type", "env_kwargs", "num_threads",
})  # fmt: skip
_DEVICE_OPTIONS = ("device", "env_device", "policy_device", "storing_device")


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigurationError.bad_value(name, value, "a positive, finite number of seconds")
    return float(value)


def _check_int(name: str, value: object, minimum: int, *, optional: bool = False) -> Any:
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = f"{'None or ' if optional else ''}an int >= {minimum}"
        raise ConfigurationError.bad_value(name, value, expected)
    return value


def _load_keys(keys: object) -> ServerKeys | None:
    if keys is None or isinstance(keys, ServerKeys):
        return keys
    if isinstance(keys, (str, os.PathLike)):
        return ServerKeys.load(keys)
    raise ConfigurationError.bad_value("keys", keys, "None, a key directory (`acollect keys DIR`) or a ServerKeys")


def _params_of(name: str, source: object) -> TensorDictBase:
    return as_weights(source, name)  # a state dict means the same as TensorDict.from_module


class MultiCollectorBase(CollectorBase):
    """Shared machinery of :class:`MultiSyncCollector` and :class:`MultiAsyncCollector` (see their docs)."""

    def __init__(
        self,
        create_env_fn_list: Any,
        policy: PolicyLike = None,
        *,
        policy_factory: Callable[[], PolicyLike] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        num_workers: int | None = None,
        collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        storing_device: Any = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int = 0,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        env_kwargs: Mapping[str, Any] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int | None = None,
        weight_sync_schemes: Mapping[str, Any] | None = None,
        max_worker_restarts: int = 0,
        heartbeat_timeout: float = 30.0,
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 5.0,
        address: str | None = None,
        start_method: str = "spawn",
        launcher: Any = "local",
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Any = None,
        progress: bool | str = False,
        copy_batches: bool = True,
    ) -> None:
        frames_per_batch = check_frames_per_batch(frames_per_batch)
        super().__init__(frames_per_batch=frames_per_batch, total_frames=total_frames, progress=progress)
        env_fns = self._env_fns(create_env_fn_list, num_workers)
        n = len(env_fns)
        if policy is not None and policy_factory is not None:
            raise ConfigurationError(
                "policy and policy_factory were both given: pass one (policy_factory builds the policy in each worker)."
            )
        if policy_factory is not None and not callable(policy_factory) and not isinstance(policy_factory, str):
            raise ConfigurationError.bad_value("policy_factory", policy_factory, "a zero-argument callable")
        if postproc is not None and not callable(postproc):
            raise ConfigurationError.bad_value("postproc", postproc, "None or a callable on TensorDicts")
        if start_method not in START_METHODS:
            raise ConfigurationError.bad_value("start_method", start_method, f"one of {START_METHODS}")
        if use_shared_memory not in (None, True, False):
            raise ConfigurationError.bad_value("use_shared_memory", use_shared_memory, "None, True or False")
        self.remote_workers = _check_int("remote_workers", remote_workers, 0)
        if remote_workers > n:
            raise ConfigurationError.bad_value("remote_workers", remote_workers, f"at most num_workers = {n}")
        self._server_keys = _load_keys(keys)
        if remote_workers and (self._server_keys is None or not isinstance(address, str)):
            raise ConfigurationError.bad_value(
                "remote_workers", remote_workers,
                "0 unless address='tcp://HOST:PORT' and keys=<directory from `acollect keys`> are given "
                "(workers started by hand must connect to a known address and authenticate)",
            )  # fmt: skip
        if not isinstance(copy_batches, bool):
            raise ConfigurationError.bad_value("copy_batches", copy_batches, "True or False")
        self.heartbeat_timeout = _check_seconds("heartbeat_timeout", heartbeat_timeout)
        self.startup_timeout = _check_seconds("startup_timeout", startup_timeout)
        self.shutdown_timeout = self._shutdown_limit = _check_seconds("shutdown_timeout", shutdown_timeout)
        self.max_worker_restarts = _check_int("max_worker_restarts", max_worker_restarts, 0)
        self.max_weight_update_interval = _check_int(
            "max_weight_update_interval", max_weight_update_interval, 1, optional=True
        )
        self.update_after_each_batch = bool(update_after_each_batch)
        self.weight_sync_schemes = self._check_schemes(weight_sync_schemes)
        self.postproc = postproc
        self.split_trajs = bool(split_trajs)
        self.address = address
        self.start_method = start_method
        self.launcher = resolve_launcher(launcher, start_method=start_method)
        self.launcher.check_address(address)
        self.use_shared_memory = use_shared_memory
        self.copy_batches = copy_batches
        self._policy_arg = policy

        shared = {
            "device": device, "env_device": env_device, "policy_device": policy_device,
            "storing_device": storing_device, "max_frames_per_traj": max_frames_per_traj,
            "init_random_frames": init_random_frames, "reset_at_each_iter": reset_at_each_iter,
            "exploration_type": exploration_type, "env_kwargs": env_kwargs, "num_threads": num_threads,
        }  # fmt: skip
        # What crosses processes is host memory. One storing device for the whole collector is therefore
        # applied where batches are handed out; workers then store on the CPU and need no CUDA context
        # just to hold a batch. (A list of devices, one per worker, is passed to the workers as is.)
        store = storing_device if storing_device is not None else device
        self._storing_device = None if isinstance(store, (list, tuple)) else check_device("storing_device", store)
        if self._storing_device is not None and self._storing_device.type != "cpu":
            shared["storing_device"] = "cpu"
        options = [self._worker_options(shared, collector_kwargs, i, n) for i in range(n)]
        import acollect

        filter_warnings = bool(getattr(acollect, "filter_warnings_subprocess", True))
        frames = self._worker_frames(n)
        self._configs = [
            P.WorkerConfig(
                index=i,
                generation=0,
                n_workers=n,
                address="",
                parent_pid=os.getpid(),
                create_env_fn=env_fns[i],
                policy=policy,
                policy_factory=policy_factory,
                frames_per_batch=frames,
                env_kwargs=dict(opts["env_kwargs"] or {}),
                devices={k: opts[k] for k in _DEVICE_OPTIONS},
                max_frames_per_traj=opts["max_frames_per_traj"],
                init_random_frames=opts["init_random_frames"],
                reset_at_each_iter=bool(opts["reset_at_each_iter"]),
                exploration_type=opts["exploration_type"],
                num_threads=opts["num_threads"],
                filter_warnings=filter_warnings,
                heartbeat_interval=min(1.0, self.heartbeat_timeout / 4),
                remote=i >= n - self.remote_workers,
            )
            for i, opts in enumerate(options)
        ]
        self._pool: WorkerPool | None = None
        self._rejected_before = 0
        self._pending_seed: int | None = None
        self._pending_state: Mapping[str, Any] | None = None
        self._pending_weights: TensorDictBase | None = None
        self._initial_version = 0
        self._last_push = 0
        # copy_batches=False: the batch handed out last, whose slot goes back to its worker at the next batch.
        self._lent: list[Received] = []

    # -- argument checks -------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        """Number of worker processes."""
        return len(self._configs)

    def _worker_frames(self, n_workers: int) -> int:
        raise NotImplementedError

    def _credits(self) -> int | None:
        raise NotImplementedError

    @staticmethod
    def _env_fns(create_env_fn_list: Any, num_workers: int | None) -> list[Any]:
        if isinstance(create_env_fn_list, (list, tuple)):
            fns = list(create_env_fn_list)
            if not fns:
                raise ConfigurationError.bad_value("create_env_fn_list", fns, "a non-empty list of env factories")
            if num_workers is not None and num_workers != len(fns):
                raise ConfigurationError.bad_value(
                    "num_workers", num_workers, f"None or len(create_env_fn_list) = {len(fns)}"
                )
        else:
            if create_env_fn_list is None:
                raise ConfigurationError.bad_value(
                    "create_env_fn_list", None, "a list of env factories, or one env factory / gymnasium id"
                )
            n = _check_int("num_workers", num_workers, 1, optional=True) or os.cpu_count() or 1
            fns = [create_env_fn_list] * n
        for i, fn in enumerate(fns):
            if fn is None:
                raise ConfigurationError.bad_value(f"create_env_fn_list[{i}]", None, "an env factory or gymnasium id")
        return fns

    @staticmethod
    def _worker_options(shared: dict[str, Any], collector_kwargs: Any, i: int, n: int) -> dict[str, Any]:
        opts = dict(shared)
        for name in _DEVICE_OPTIONS:
            value = opts[name]
            if isinstance(value, (list, tuple)):
                if len(value) != n:
                    raise ConfigurationError.bad_value(name, value, f"one device, or a list of {n} (one per worker)")
                opts[name] = value[i]
        if collector_kwargs is not None:
            if isinstance(collector_kwargs, Mapping):
                extra = collector_kwargs
            elif isinstance(collector_kwargs, (list, tuple)) and len(collector_kwargs) == n:
                extra = collector_kwargs[i]
            else:
                raise ConfigurationError.bad_value(
                    "collector_kwargs", collector_kwargs, f"a dict, or a list of {n} dicts (one per worker)"
                )
            unknown = set(extra) - PER_WORKER_OPTIONS
            if unknown:
                raise ConfigurationError.bad_value(
                    "collector_kwargs", sorted(unknown), f"options among {sorted(PER_WORKER_OPTIONS)}"
                )
            opts.update(extra)
        for name in _DEVICE_OPTIONS:
            check_device(name, opts[name])
        exploration = parse_exploration_type(opts["exploration_type"])
        opts["exploration_type"] = exploration.name if exploration is not None else None
        _check_int("max_frames_per_traj", opts["max_frames_per_traj"], 1, optional=True)
        _check_int("init_random_frames", opts["init_random_frames"], 0)
        _check_int("num_threads", opts["num_threads"], 1)
        if opts["env_kwargs"] is not None and not isinstance(opts["env_kwargs"], Mapping):
            raise ConfigurationError.bad_value("env_kwargs", opts["env_kwargs"], "None or a dict")
        return opts

    @staticmethod
    def _check_schemes(schemes: Mapping[str, Any] | None) -> dict[str, WeightSyncScheme]:
        if schemes is None:
            return {}
        if not isinstance(schemes, Mapping):
            raise ConfigurationError.bad_value("weight_sync_schemes", schemes, "a dict of model id -> scheme")
        for key, scheme in schemes.items():
            if not isinstance(key, str) or not isinstance(scheme, WeightSyncScheme):
                raise ConfigurationError.bad_value(
                    f"weight_sync_schemes[{key!r}]", scheme,
                    "a WeightSyncScheme (ZmqWeightSyncScheme() or SharedMemWeightSyncScheme()) under a str model id",
                )  # fmt: skip
        return dict(schemes)

    # -- lifecycle -----------------------------------------------------------------------
    def _require_pool(self) -> WorkerPool:
        if self._pool is None:
            raise CollectorStateError("the collector's workers are not running")
        return self._pool

    def _new_pool(self, *args: Any, **kwargs: Any) -> WorkerPool:
        """Builds the worker pool (subclasses moving data another way return a subclass of it)."""
        return WorkerPool(*args, **kwargs)

    async def _setup(self) -> None:
        pool = self._new_pool(
            self._configs,
            start_method=self.start_method,
            launcher=self.launcher,
            address=self.address,
            credits=self._credits(),
            use_shared_memory=self.use_shared_memory,
            heartbeat_timeout=self.heartbeat_timeout,
            startup_timeout=self.startup_timeout,
            max_restarts=self.max_worker_restarts,
            keys=self._server_keys,
            on_failure=self._fail,
        )
        pool.version = self._initial_version
        # Recorded before it starts: a start cancelled or failing half-way is closed by _teardown.
        self._pool = pool
        self._lent = []
        await pool.start(self._tasks)
        await self._apply_pending()

    async def _teardown(self) -> None:
        # Workers get ``stop``, then SIGTERM, then SIGKILL, all within shutdown_timeout.
        pool = self._pool
        if pool is not None:
            await pool.close(self.shutdown_timeout)

    def _set_shutdown_timeout(self, timeout: float) -> None:
        self.shutdown_timeout = self._shutdown_limit = timeout

    @property
    def rejected_messages(self) -> int:
        """Messages the endpoint dropped: not from a live worker (a stray or hostile peer), or replayed batches.

        Each is logged with its reason on the ``"acollect"`` logger; none is ever unpickled. Peers refused
        at the handshake (wrong CURVE key) are counted in :attr:`rejected_peers` instead.
        """
        return self._pool.rejected_messages if self._pool is not None else 0

    @property
    def rejected_peers(self) -> int:
        """Connection attempts refused by the endpoint's CURVE keys (a key not on the allow-list, no CURVE,
        a wrong collector key); each attempt of a peer that keeps retrying counts. ``0`` without ``keys``."""
        pool = self._pool
        if pool is None or pool.endpoint is None:
            return self._rejected_before
        self._rejected_before = pool.endpoint.rejected_connections
        return self._rejected_before

    @property
    def endpoint_address(self) -> str | None:
        """The address workers connect to, with the real port of ``tcp://...:0`` (``None`` before start)."""
        pool = self._pool
        return pool.endpoint.address if pool is not None and pool.endpoint is not None else None

    @property
    def dropped_batches(self) -> int:
        """Batches lost to worker restarts (collected in part by a worker that died, never handed out)."""
        return self._pool.dropped_batches if self._pool is not None else 0

    def _worker_counters(self) -> tuple[int, int]:
        if self._pool is None:
            return 0, 0
        return sum(h.restarts for h in self._pool.handles), self._pool.dropped_batches

    @property
    def worker_pids(self) -> list[int | None]:
        """The pid of each worker process (``None`` before start)."""
        if self._pool is None:
            return [None] * self.num_workers
        return [h.pid for h in self._pool.handles]

    # -- per batch -------------------------------------------------------------------------
    async def _before_batch(self) -> None:
        await self._return_lent()
        await self._apply_pending()
        if self._policy_arg is None or not isinstance(self._policy_arg, torch.nn.Module):
            return
        due = self.update_after_each_batch and self._batches > 0
        interval = self.max_weight_update_interval
        if due or (interval is not None and self._batches - self._last_push >= interval):
            await self._push({"policy": _params_of("policy", self._policy_arg)}, range(self.num_workers), 30.0)

    async def _apply_pending(self) -> None:
        pool = self._require_pool()
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            for handle, counters in zip(pool.handles, state["workers"], strict=True):
                handle.traj_counter, handle.frames = int(counters["next_traj_counter"]), int(counters["frames"])
                fields = {"next_traj_counter": handle.traj_counter, "frames": handle.frames}
                await pool.send(handle, P.LOAD_STATE, fields)
        if self._pending_seed is not None:
            seed, self._pending_seed = self._pending_seed, None
            for handle in pool.handles:
                await pool.send(handle, P.SEED, {"seed": seed})
                seed += handle.n_envs
        if self._pending_weights is not None:
            weights, self._pending_weights = self._pending_weights, None
            await self._push({"policy": _params_of("state_dict", weights)}, range(self.num_workers), 30.0)

    async def _release(self, item: Received, *, lend: bool = False) -> None:
        """Counts ``item`` and gives its credit (and slot) back, or, with ``lend``, at the next batch."""
        header = item.header
        # The worker counted its episodes: statistics cost no message of their own.
        self._record_worker(item.worker, item.data.numel(), int(header["policy_version"]),
                            EpisodeSummary.from_header(header.get("episodes")))  # fmt: skip
        if lend:
            self._lent.append(item)
        else:
            await self._give_back(item)

    async def _give_back(self, item: Received) -> None:
        pool = self._require_pool()
        handle = pool.handles[item.worker]
        if item.generation == handle.generation:
            await pool.send(handle, P.CREDIT, {"slot": item.header.get("slot")})

    async def _return_lent(self) -> None:
        """Ends the loan of the last batch handed out without a copy: its slots may be written again."""
        lent, self._lent = self._lent, []
        for item in lent:
            await self._give_back(item)

    def _finish(self, batch: TensorDictBase) -> TensorDictBase:
        if self._storing_device is not None and self._storing_device.type != "cpu":
            batch = batch.to(self._storing_device, non_blocking=True)
        if self.split_trajs:
            batch = split_trajectories(batch)
        if self.postproc is not None:
            batch = self.postproc(batch)
        return batch

    # -- weights -------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """Version of the last weights pushed (every batch carries the version it was collected with)."""
        return self._pool.version if self._pool is not None else self._initial_version

    async def update_policy_weights_(
        self,
        policy_or_weights: torch.nn.Module | TensorDictBase | Mapping[str, torch.Tensor] | None = None,
        *,
        policy: torch.nn.Module | None = None,
        weights: TensorDictBase | Mapping[str, torch.Tensor] | None = None,
        weights_dict: Mapping[str, Any] | None = None,
        model_id: str = "policy",
        worker_ids: Sequence[int] | None = None,
        timeout: float = 30.0,
    ) -> int:
        """Pushes new weights to the workers and returns once every targeted worker has them.

        The weights are serialized once (a flat buffer, or a shared-memory segment for local workers) and
        applied by each worker at its next batch boundary, so no batch mixes two versions.

        Args:
            policy_or_weights: an ``nn.Module``, a TensorDict of weights or a state dict; nothing re-sends
                the weights of the ``policy`` given at construction.
            policy: keyword form for a module.
            weights: keyword form for weights.
            weights_dict: several models at once, ``{model_id: module or weights}``, updated atomically (one
                version, one message per worker).
            model_id: which model these weights are for: ``"policy"``, or a path such as ``"policy.actor"``.
            worker_ids: the workers to update (default: all).
            timeout: seconds to wait for the acknowledgements.

        Returns:
            The new policy version.

        Raises:
            WeightSyncError: workers that did not acknowledge in time, or refused the weights (named in the error).
            ConfigurationError: no weights, weights that do not fit the workers' policy (nothing is sent; the
                message names the keys and shapes), or bad ``worker_ids``.
        """
        # Allowed on a collector broken by one worker (while the caller iterates): the live ones still get
        # the weights, and the WeightSyncError names exactly the workers that did not.
        one_worker = isinstance(getattr(self._failure, "worker_id", None), int) and not self._background
        self._check_usable("update_policy_weights_()", allow_broken=one_worker)
        given = [x for x in (policy_or_weights, policy, weights) if x is not None]
        if len(given) > 1 or (given and weights_dict is not None):
            raise ConfigurationError(
                "update_policy_weights_() takes one source of weights: a policy, weights, or weights_dict"
            )
        if weights_dict is not None:
            if not isinstance(weights_dict, Mapping) or not weights_dict:
                raise ConfigurationError.bad_value("weights_dict", weights_dict, "a non-empty dict model id -> weights")
            models = {str(k): _params_of(f"weights_dict[{k!r}]", v) for k, v in weights_dict.items()}
        else:
            source = given[0] if given else self._policy_arg
            if not isinstance(model_id, str) or not model_id:
                raise ConfigurationError.bad_value("model_id", model_id, "a non-empty str such as 'policy'")
            models = {model_id: _params_of("policy_or_weights", source)}
        ids = list(range(self.num_workers)) if worker_ids is None else list(worker_ids)
        for wid in ids:
            if isinstance(wid, bool) or not isinstance(wid, int) or not 0 <= wid < self.num_workers:
                expected = f"worker indices in [0, {self.num_workers})"
                raise ConfigurationError.bad_value("worker_ids", worker_ids, expected)
        limit = _check_seconds("timeout", timeout)
        with self._call("update_policy_weights_()", interrupt_on_failure=False):
            await self._ensure_setup()
            return await self._push(models, ids, limit)

    async def _push(self, models: Mapping[str, TensorDictBase], ids: Sequence[int], limit: float) -> int:
        pool = self._require_pool()
        # Refused here, before anything is sent, if they do not fit the policy each worker reported in its hello.
        models = check_push(models, [pool.handles[i].weights_structure for i in ids])
        version = await pool.push_weights(models, self.weight_sync_schemes, self._default_scheme, ids, limit)
        self._last_push = self._batches
        return version

    def _default_scheme(self) -> WeightSyncScheme:
        local = self.launcher.same_host and (self.address is None or self.address.startswith("ipc://"))
        return SharedMemWeightSyncScheme() if local and shm_available() else ZmqWeightSyncScheme()

    # -- seeds and state ---------------------------------------------------------------------
    def set_seed(self, seed: int) -> int:
        """Seeds every worker: worker ``i`` gets ``seed`` plus the number of envs of the workers before it.

        Applied at the next batch boundary, which starts from a fresh seeded reset.

        Returns:
            The next free seed (``seed + total number of envs`` once the workers started, else
            ``seed + num_workers``).
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigurationError.bad_value("seed", seed, "an int")
        self._check_usable("set_seed()")
        self._pending_seed = seed
        if self._pool is not None and all(h.n_envs for h in self._pool.handles):
            return seed + sum(h.n_envs for h in self._pool.handles)
        return seed + self.num_workers

    def state_dict(self) -> dict[str, Any]:
        """Counters of the collector and of every worker, the policy version and this process's policy weights."""
        if self._pool is not None:
            workers = [{"next_traj_counter": h.traj_counter, "frames": h.frames} for h in self._pool.handles]
        elif self._pending_state is not None:
            workers = [dict(w) for w in self._pending_state["workers"]]
        else:
            workers = [{"next_traj_counter": 0, "frames": 0} for _ in self._configs]
        module = self._policy_arg if isinstance(self._policy_arg, torch.nn.Module) else None
        return {
            "frames": self._frames,
            "batches": self._batches,
            "policy_version": self.policy_version,
            "workers": workers,
            "policy_state_dict": TensorDict.from_module(module).clone() if module is not None else None,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved.

        Worker counters and weights reach the workers before the next batch.
        """
        missing = {"frames", "batches", "policy_version", "workers"} - set(state_dict)
        if missing:
            raise ConfigurationError.bad_value(
                "state_dict", sorted(state_dict), f"a multi-process collector state dict (missing {sorted(missing)})"
            )
        workers = state_dict["workers"]
        if not isinstance(workers, Sequence) or len(workers) != self.num_workers:
            raise ConfigurationError.bad_value(
                "state_dict['workers']", workers, f"a list of {self.num_workers} worker states (one per worker)"
            )
        self._check_usable("load_state_dict()")
        self._frames = int(state_dict["frames"])
        self._batches = int(state_dict["batches"])
        version = int(state_dict["policy_version"])
        if self._pool is not None:
            self._pool.version = version
        self._initial_version = version
        self._pending_state = {"workers": [dict(w) for w in workers]}
        weights = state_dict.get("policy_state_dict")
        if weights is not None:
            self._pending_weights = weights
            # The push bumps the version: start one below so the restored version is what batches carry.
            if self._pool is not None:
                self._pool.version = version - 1
            self._initial_version = version - 1
