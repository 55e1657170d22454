"""What the multi-process collectors share: the worker pool, its lifecycle, what it says, and the batch loop.

What the trainer changes in the workers between batches (a seed, saved counters, weights) is one of its parts,
:class:`~acollect.collectors._worker_changes.WorkerChanges`.

Each public class's settings become per-worker configs in :mod:`acollect.collectors._worker_configs`. Lockstep
(sync) and first-ready (async) collection differ by the dispatch strategy (:mod:`acollect.collectors._dispatch`),
fixed by the class or chosen by a ``sync`` option (``DistributedCollector``, ``RayCollector``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase

from acollect._affinity import TrainerPin
from acollect._batches.lending import default_budget
from acollect._batches.trajectory_batches import TrajectoryAssembler
from acollect._devices import with_index
from acollect._episodes import EpisodeSummary
from acollect._policy import PolicyLike
from acollect._time_split import reported_split
from acollect._validate import check_int
from acollect._warnings import warn
from acollect._weights.updates import WeightUpdate, params_of
from acollect._workers.handles import Received, WorkerState
from acollect._workers.pool import WorkerPool
from acollect._workers.pool_settings import PoolSettings
from acollect._workers.protocol import WorkerConfig
from acollect.collectors._base import CollectorBase
from acollect.collectors._collector_settings import MultiAsyncSettings, MultiSyncSettings
from acollect.collectors._dispatch import Dispatch, dispatch_for
from acollect.collectors._handout import HandOut
from acollect.collectors._option_checks import check_policy_args
from acollect.collectors._options import WorkerSettings
from acollect.collectors._worker_changes import WorkerChanges
from acollect.collectors._worker_configs import (
    collector_storing_device,
    cuda_contexts_warning,
    plan_workers,
)
from acollect.errors import CollectorStateError

__all__ = ["MultiCollectorBase"]


class MultiCollectorBase(CollectorBase):
    """Shared machinery of the multi-process collectors (see :class:`MultiSyncCollector` and
    :class:`MultiAsyncCollector`): each holds the worker pool and one dispatch strategy."""

    settings_class: ClassVar[type[MultiSyncSettings] | type[MultiAsyncSettings]]
    #: The options given, checked, every default filled in.
    settings: MultiSyncSettings | MultiAsyncSettings

    def __init__(
        self, create_env_fn_list: Any, policy: PolicyLike, settings: MultiSyncSettings | MultiAsyncSettings
    ) -> None:
        """Builds the workers' configs, and the dispatch strategy (how batches are taken from the workers), from
        ``settings``: the public class's keywords, checked once into its ``settings_class``."""
        self.settings = settings
        self._dispatch: Dispatch = dispatch_for(settings)
        check_policy_args(policy, settings.policy_factory)
        self._policy_arg = policy
        plan = plan_workers(create_env_fn_list, *self._worker_policy(), stacked=self._dispatch.sync)
        super().__init__(
            batch=plan.batch,
            total_frames=settings.total_frames,
            progress=settings.progress,
            shutdown_timeout=settings.shutdown_timeout,
        )
        self._configs = plan.configs
        many_contexts = cuda_contexts_warning(plan.configs, self._worker_policy()[0])
        if many_contexts is not None:
            warn(many_contexts)
        # worker_affinity="auto": the trainer's threads on the cores the workers left, while the workers run.
        self._trainer_pin = TrainerPin(plan.affinity.trainer)
        # A bare "cuda" is the device current here and now (each thread has its own current device).
        self._storing_device = with_index(collector_storing_device(self._worker_policy()[1]))
        # How batches leave: lent (shared memory given back once dropped), copied, or moved to a GPU.
        # split_trajs and postproc, settled once: the settings never change.
        self._reshape = settings.reshaper()
        self._handout = HandOut(
            self._dispatch,
            copy_batches=settings.copy_batches,
            storing_device=self._storing_device,
            budget=settings.max_lent_bytes if settings.max_lent_bytes is not None else default_budget(),
            cuda_dma=settings.cuda_dma,
        )
        self._pool: WorkerPool | None = None
        self._rejected_before = 0
        # A seed, saved counters and weights, staged for the next batch boundary; the version workers start from.
        self._worker_changes = WorkerChanges()
        self._stale_batches = 0  # dropped for being more than max_policy_lag versions behind
        self._episodes_to_end: set[int] = set()  # lost workers whose episodes in progress are still to be cut

    def _worker_policy(self) -> tuple[PolicyLike, WorkerSettings]:
        """What the workers run, and the settings their configs are built from (central inference: none)."""
        return self._policy_arg, self.settings

    def _trajectory_id_stride(self) -> int:
        return self.num_workers  # worker k of n takes the ids k, k + n, ... (acollect._workers.worker_engine)

    @property
    def num_workers(self) -> int:
        """Number of worker processes."""
        return len(self._configs)

    @property
    def sync(self) -> bool:
        """``True``: lockstep batches from every worker; ``False``: each worker's batch, first ready first served."""
        return self._dispatch.sync

    @property
    def credits(self) -> int | None:
        """Batches each worker may collect ahead of the caller (first ready, ``sync=False``); ``None`` in lockstep,
        where a worker collects only the parts it is asked for."""
        return self._dispatch.credits

    @property
    def worker_configs(self) -> tuple[WorkerConfig, ...]:
        """What each worker is started from, by worker id: its env factory and ``env_kwargs``, its devices, its
        ``frames_per_batch`` (what it collects per batch it sends), its policy or ``policy_factory``.

        Built at construction (``RayCollector.add_collectors`` builds them again; ``AsyncBatchedCollector`` adds
        where its inference server listens when it starts). Each process started in a worker's slot, a restart
        too, gets its slot's config with the collector's address and the slot's counters filled in.

        Examples:
            >>> from acollect import MultiSyncCollector
            >>> from acollect.testing import CountingEnv
            >>> collector = MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8)
            >>> [config.rollout.frames_per_batch for config in collector.worker_configs]  # lockstep: a part each
            [4, 4]
        """
        return tuple(self._configs)

    @property
    def pool(self) -> WorkerPool | None:
        """The worker pool behind the collector: ``None`` until it starts; after shutdown, the closed pool.

        For looking at the workers: ``pool.handles[i]`` is what the collector knows of worker ``i`` (its
        :class:`~acollect._workers.WorkerState`, ``pid``, ``where`` it runs, its launched ``process``, restarts, the
        parts it holds), ``pool.launcher`` starts them and ``pool.failure`` is what broke the pool. Commands sent
        through the pool itself (``send``, ``weights.push``) skip the collector's own checks: use the collector's
        methods to change its workers.
        """
        return self._pool

    # -- lifecycle -----------------------------------------------------------------------
    def _require_pool(self) -> WorkerPool:
        if self._pool is None:
            raise CollectorStateError("the collector's workers are not running")
        return self._pool

    def _new_pool(self, settings: PoolSettings) -> WorkerPool:
        """Builds the worker pool (subclasses moving data another way return a subclass of it)."""
        return WorkerPool(self._configs, settings, on_failure=self._fail, on_lost=self._lost)

    def _pool_settings(self) -> PoolSettings:
        """What the pool is told: the collector's options and what its dispatch strategy asks of the workers."""
        settings, dispatch = self.settings, self._dispatch
        return PoolSettings(
            launcher=settings.launcher,
            address=settings.address,
            keys=settings.keys,
            use_shared_memory=settings.use_shared_memory,
            credits=dispatch.credits,
            slots=dispatch.slots,
            shared_batches=dispatch.shared_batches,
            heartbeat_timeout=settings.heartbeat_timeout,
            startup_timeout=settings.startup_timeout,
            max_restarts=settings.max_worker_restarts,
            on_worker_loss=settings.on_worker_loss,
            weight_sync_schemes=settings.weight_sync_schemes,
        )

    async def _setup(self) -> None:
        pool = self._new_pool(self._pool_settings())
        pool.weights.version = self._worker_changes.initial_version
        # Recorded before it starts: a start cancelled or failing half-way is closed by _teardown.
        self._pool = pool
        self._handout.open()
        await pool.start(self._tasks)
        # Pinned once the workers started, not before: a fork server started now (start_method="forkserver")
        # would keep the trainer's cores for the rest of the program, and every later worker forked from it too.
        self._trainer_pin.pin()
        # Every worker said in its hello how many envs it built: the truth, whatever construction guessed.
        # Warned here, on the event loop, so the warning points at the user's `async with` / `async for`.
        self._settle_batch([h.hello.n_envs for h in pool.handles])
        self._worker_changes.check_env_seeds(pool, type(self).__name__)
        await self._worker_changes.apply(pool, self._push, self.num_workers)
        paused = self._lifecycle.pauses > 0
        await self._dispatch.start(pool, paused=paused)
        self._lifecycle.pause_was_applied(paused)

    async def _teardown(self) -> None:
        self._handout.close()  # registered memory is unregistered before the pool unmaps it
        # Workers get ``stop``, then SIGTERM, then SIGKILL, all within shutdown_timeout.
        pool = self._pool
        try:
            if pool is not None:
                await pool.close(self._lifetime.limit)
        finally:
            self._trainer_pin.restore()
        self._dispatch.reset()

    def _release_now(self) -> None:
        self._handout.close()
        self._trainer_pin.restore()
        if self._pool is not None:
            self._pool.abandon()
        self._dispatch.reset()

    @property
    def rejected_messages(self) -> int:
        """Messages the endpoint dropped: not from a live worker (a stray or hostile peer), or replayed batches.

        Each is logged with its reason on the ``"acollect"`` logger; none is ever unpickled. Peers refused
        at the handshake (wrong CURVE key) are counted in :attr:`rejected_peers` instead.
        """
        return self._pool.counters.rejected_messages if self._pool is not None else 0

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
        return self._pool.counters.dropped_batches if self._pool is not None else 0

    def _counters(self) -> dict[str, Any]:
        pool = self._pool
        counters: dict[str, Any] = {"stale_batches": self._stale_batches}
        if pool is not None:
            counters.update(
                restarts=sum(h.restarts for h in pool.handles),
                dropped_batches=pool.counters.dropped_batches,
                discarded_frames=pool.counters.discarded_frames,
                lost_workers=pool.counters.lost_workers,
                env_restarts=pool.counters.env_restarts,
                env_restarts_by_sub_env=pool.sub_env_restarts,
            )
        return counters

    @property
    def worker_states(self) -> list[WorkerState | None]:
        """Each worker's :class:`~acollect._workers.WorkerState` as the collector sees it (``None`` before start).

        A worker lost for good under ``on_worker_loss="continue"`` stays ``LOST`` until shutdown. The table of
        states and moves is in ``docs/concepts.md`` ("Workers and the pool: their states").
        """
        if self._pool is None:
            return [None] * self.num_workers
        return [h.state for h in self._pool.handles]

    @property
    def trainer_cores(self) -> tuple[int, ...] | None:
        """The cores this process's threads are pinned to while the workers run (``worker_affinity="auto"``,
        with cores left by the workers), given back as they were at shutdown; ``None``: the trainer is not pinned.
        Each worker's cores are in its config (:attr:`worker_configs`, ``affinity``).

        Examples:
            >>> from acollect import MultiSyncCollector
            >>> from acollect.testing import CountingEnv
            >>> MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8).trainer_cores is None
            True
        """
        return self._trainer_pin.cores

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the workers' shared memory page-locked (registered with CUDA) for copies by DMA to a GPU
        ``storing_device``: the segments the pool made and maps now, once a batch in them was copied. ``0`` where
        batches are not stored on a GPU. It grows with the pool's segments, never with the batches handed out.

        Examples:
            >>> from acollect import MultiSyncCollector
            >>> from acollect.testing import CountingEnv
            >>> MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8).pinned_bytes
            0
        """
        return self._handout.pinned_bytes

    @property
    def worker_pids(self) -> list[int | None]:
        """The pid of each worker process: ``None`` before start, and for a worker lost for good (``LOST`` in
        :attr:`worker_states`, under ``on_worker_loss="continue"``), whose process is gone and whose number the
        system may give to another."""
        if self._pool is None:
            return [None] * self.num_workers
        return [None if h.lost else h.pid for h in self._pool.handles]

    async def _apply_pause(self, paused: bool) -> None:
        await self._dispatch.apply_pause(self._pool, paused)

    # -- seeds and state ---------------------------------------------------------------------
    def set_seed(self, seed: int) -> int:
        """Seeds every worker: worker ``i`` gets ``seed`` plus the number of envs of the workers before it.

        Applied at the next batch boundary, which starts from a fresh seeded reset.

        Returns:
            The next free seed (``seed + total number of envs`` once the workers started, else
            ``seed + num_workers``).

        Raises:
            ConfigurationError: the workers' envs can only be seeded when built (EnvPool): here once the workers
                started, else when they have (entering the collector, or its next batch).
        """
        check_int("seed", seed)
        self._calls.check_usable("set_seed()")
        return self._worker_changes.stage_seed(seed, self._pool, num_workers=self.num_workers)

    def state_dict(self) -> dict[str, Any]:
        """Counters of the collector and of every worker, the policy version and this process's policy weights."""
        workers = self._worker_changes.workers_state(self._pool, self.num_workers)
        module = self._policy_arg if isinstance(self._policy_arg, torch.nn.Module) else None
        return {
            "frames": self._counts.frames,
            "batches": self._counts.batches,
            "policy_version": self.policy_version,
            "workers": workers,
            "policy_state_dict": TensorDict.from_module(module).clone() if module is not None else None,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved.

        Worker counters and weights reach the workers before the next batch.
        """
        workers = WorkerChanges.check_saved(state_dict, self.num_workers)
        self._calls.check_usable("load_state_dict()")
        self._counts.restore(int(state_dict["frames"]), int(state_dict["batches"]))
        self._worker_changes.restore(
            int(state_dict["policy_version"]), workers, state_dict.get("policy_state_dict"), self._pool
        )

    # -- per batch -------------------------------------------------------------------------
    async def _collect_batch(self) -> TensorDictBase:
        pool = self._require_pool()
        await self._handout.take_back(pool)
        await self._worker_changes.apply(pool, self._push, self.num_workers)
        if self._worker_changes.push_due(self._counts.batches, self.settings, self._policy_arg):
            await self._push({"policy": params_of("policy", self._policy_arg)}, range(self.num_workers), 30.0)
        items = await self._take_fresh(pool)
        for item in items:
            # The worker counted its episodes and timed its parts: statistics cost no message.
            header = item.header
            episodes = EpisodeSummary.from_header(header.get("episodes"))
            self._counts.stats.record_worker(
                item.worker, item.data.numel(), self._batch_version(item), episodes, time_spent=reported_split(header)
            )
        return await self._handout.hand_out(pool, items, self._reshape)

    async def _take_fresh(self, pool: WorkerPool) -> list[Received]:
        """The next batch's items, those more than ``max_policy_lag`` versions behind dropped (and given back)."""
        limit = getattr(self.settings, "max_policy_lag", None)
        # Within one call the collector's version does not move unless another task pushes weights: after the batches
        # collected ahead under older weights, a fresh one comes. Weights that change faster than a batch is collected
        # would drop every batch: past this many in a row the caller is told, not left waiting.
        most = 4 * self.num_workers * (getattr(self.settings, "credits", None) or 1) + 8
        for _ in range(most):
            items = await self._dispatch.take(pool, ahead=self._wants_next())
            if limit is None or all(self.policy_version - self._batch_version(item) <= limit for item in items):
                return items
            self._stale_batches += 1  # its worker's stream goes on with its next batch
            for item in items:
                await self._handout.give_back(pool, item)
        raise CollectorStateError(
            f"max_policy_lag={limit}: the last {most} batches were each more than {limit} versions behind the "
            f"collector's weights (version {self.policy_version}): the weights change faster than a batch is "
            "collected; push less often or raise max_policy_lag"
        )

    def _wants_next(self) -> bool:
        """Whether workers may begin the batch after this one now: not when it is the last, nor when the
        collector will push weights before it (a batch begun before a push is not handed out after it)."""
        if self.total_frames != -1 and self._counts.frames + self.frames_per_batch >= self.total_frames:
            return False
        if self.settings.update_after_each_batch:
            return False
        return not self._worker_changes.push_due(self._counts.batches + 1, self.settings, self._policy_arg)

    def _lost(self, live: int) -> None:
        """On the event loop: a worker was lost (``on_worker_loss="continue"``), ``live`` are left."""
        lost = [h.index for h in self._require_pool().handles if h.lost]
        for index in lost:
            self._counts.stats.time.forget(index)  # its last report would otherwise count on in the time split
        if self.settings.trajs_per_batch is not None:
            self._episodes_to_end.update(lost)

    def _assembled(self, assembler: TrajectoryAssembler) -> None:
        # A lost worker's episodes in progress get no more frames, so they are handed out, cut: once the batches it
        # delivered before its loss (still queued) are in, or a queued one would open a piece of them again.
        if self._episodes_to_end:
            pool = self._require_pool()
            queued = {item.worker for item in pool.ready_queue}
            for worker in [w for w in self._episodes_to_end if w not in queued]:
                assembler.end_worker(worker)
                self._episodes_to_end.discard(worker)

    def _batch_version(self, item: Received) -> int:
        """The oldest policy version that chose an action in ``item`` (what its policy lag is measured from).

        A worker applies weights at batch boundaries only, so its header's version is every frame's.
        """
        return int(item.header["policy_version"])

    @property
    def lent(self) -> dict[str, int]:
        """What the caller holds of the workers' shared memory: ``batches`` lent now, ``bytes`` lent now,
        ``budget`` (``max_lent_bytes``), ``lent_so_far``, and ``copies_over_budget`` (batches handed out as copies
        because lending them would have passed the budget)."""
        return self._handout.lent

    # -- weights -------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """Version of the last weights pushed (every batch carries the version it was collected with)."""
        return self._worker_changes.version(self._pool)

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        """Checks the weights against every targeted worker's policy, pushes them and waits for each acknowledgement.

        Serialized once (a flat buffer, or a shared-memory segment for local workers) and applied by each worker at
        its next batch boundary.
        """
        # Allowed on a collector broken by one worker (while the caller iterates): the live ones still get
        # the weights, and the WeightSyncError names exactly the workers that did not.
        one_worker = isinstance(getattr(self._lifecycle.failure, "worker_id", None), int) and not (
            self._lifecycle.background
        )
        self._calls.check_usable("update_policy_weights_()", allow_broken=one_worker)
        models, ids, ready = update.for_workers(self._policy_arg, self.num_workers)
        with self._calls.call("update_policy_weights_()", interrupt_on_failure=False):
            await self._ensure_setup()
            return await self._push(models, ids, update.timeout, ready)

    async def _push(
        self, models: Mapping[str, TensorDictBase], ids: Sequence[int], limit: float, ready: tuple[Any, ...] = ()
    ) -> int:
        """Where the collector's weights go: to its workers, through the pool's one pusher (checked against the
        policy each reported, sent, acknowledged); an ``AsyncBatchedCollector`` pushes to its server instead."""
        version = await self._require_pool().weights.push(models, ids, limit, ready)
        self._worker_changes.pushed(self._counts.batches)
        return version
