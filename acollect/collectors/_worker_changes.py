"""What the trainer changes in a multi-process collector's workers between batches: a seed, saved counters, weights.

``set_seed`` and ``load_state_dict`` return at once, and a collector may owe its workers a push every few batches:
:class:`WorkerChanges`, one of the collector's parts, holds what waits for the next batch boundary (a seed, the
workers' saved counters, saved weights), the policy version the workers start from and the batch of the last push,
and sends what waits at the boundary (:meth:`WorkerChanges.apply`): nobody else writes it. The push itself is the
collector's (``_push``: an ``AsyncBatchedCollector`` pushes to its inference server instead of its workers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect._warnings import warn
from acollect._weights.updates import params_of
from acollect._workers import protocol as P
from acollect._workers.pool import WorkerPool
from acollect.collectors._options import ProcessSettings
from acollect.envs._envpool import reseed_error, shared_seeds_warning
from acollect.errors import ConfigurationError

__all__ = ["Push", "WorkerChanges"]

#: The collector's push: ``(models, worker ids, timeout)`` -> the version the workers acknowledged.
Push = Callable[[Mapping[str, TensorDictBase], Sequence[int], float], Awaitable[int]]


class WorkerChanges:
    """A multi-process collector's changes to its workers: staged, then applied at the next batch boundary.

    Examples:
        >>> changes = WorkerChanges()
        >>> changes.stage_seed(7, None, num_workers=2)  # the next free seed: one per worker until they started
        9
        >>> from acollect.collectors._collector_settings import MultiSyncSettings
        >>> settings = MultiSyncSettings(frames_per_batch=8, max_weight_update_interval=2)
        >>> changes.version(None), changes.push_due(3, settings, policy=None)  # a policy without weights
        (0, False)
    """

    __slots__ = ("_initial_version", "_last_push", "_seed", "_state", "_weights")

    def __init__(self) -> None:
        # set_seed and load_state_dict return at once: what they ask waits here for the next batch boundary.
        self._seed: int | None = None  # the last one staged wins
        self._state: list[dict[str, Any]] | None = None  # the workers' saved counters, one dict per worker
        self._weights: TensorDictBase | None = None  # saved weights, pushed at the boundary
        self._initial_version = 0
        self._last_push = 0

    # -- the version ---------------------------------------------------------------------------
    @property
    def initial_version(self) -> int:
        """The policy version a pool (or an inference server) starts from: ``0``, what a restored state says, or
        the version the last one reached."""
        return self._initial_version

    def keep_version(self, version: int) -> None:
        """The version a closed pool (or server) reached: the next one starts from it."""
        self._initial_version = version

    def version(self, pool: WorkerPool | None) -> int:
        """The version of the last weights pushed: the pool's while there is one."""
        return pool.weights.version if pool is not None else self._initial_version

    # -- seeds ---------------------------------------------------------------------------------
    def stage_seed(self, seed: int, pool: WorkerPool | None, *, num_workers: int) -> int:
        """Stages ``seed`` for the next batch boundary; returns the next free seed (one per env once the workers
        started, else one per worker)."""
        self._refuse_seed_of_built_envs(seed, pool)
        self._seed = seed
        if pool is not None and all(h.hello.n_envs for h in pool.handles):
            return seed + sum(h.hello.n_envs for h in pool.handles)
        return seed + num_workers

    @staticmethod
    def _refuse_seed_of_built_envs(seed: int, pool: WorkerPool | None) -> None:
        """Raises where a worker's env was seeded when built (EnvPool): its reset takes no seed."""
        seeds = [h.hello.env_seed for h in pool.handles] if pool is not None else []
        if any(s is not None for s in seeds):
            raise reseed_error(seed, seeds)

    def check_env_seeds(self, pool: WorkerPool, owner: str) -> None:
        """Once every worker said hello: refuses a seed staged before, and warns (naming the collector class
        ``owner``) of workers whose envs share seeds.

        Only the workers know what their envs were built with (an EnvPool env's seed); said on the event loop, the
        error and the warning point at the user's ``async with`` / ``async for``, and a reseed never reaches a
        worker to fail there at the next batch.
        """
        if self._seed is not None:
            try:
                self._refuse_seed_of_built_envs(self._seed, pool)
            except ConfigurationError:
                self._seed = None  # refused: entering again starts without it
                raise
        message = shared_seeds_warning([(h.hello.env_seed, h.hello.n_envs) for h in pool.handles])
        if message is not None:
            warn(f"{owner}: {message}")

    # -- saved state ---------------------------------------------------------------------------
    def workers_state(self, pool: WorkerPool | None, num_workers: int) -> list[dict[str, Any]]:
        """Each worker's counters, for a state dict: the pool's, else those staged, else fresh ones."""
        if pool is not None:
            return [{"next_traj_counter": h.batches.traj_counter, "frames": h.batches.frames} for h in pool.handles]
        if self._state is not None:
            return [dict(w) for w in self._state]
        return [{"next_traj_counter": 0, "frames": 0} for _ in range(num_workers)]

    def restore(
        self, version: int, workers: Sequence[Mapping[str, Any]], weights: Any, pool: WorkerPool | None
    ) -> None:
        """Stages a saved state: the workers' counters, the weights (if any) and the version batches carry."""
        if pool is not None:
            pool.weights.version = version
        self._initial_version = version
        self._state = [dict(w) for w in workers]
        if weights is not None:
            self._weights = weights
            # The push bumps the version: start one below so the restored version is what batches carry.
            if pool is not None:
                pool.weights.version = version - 1
            self._initial_version = version - 1

    @staticmethod
    def check_saved(state_dict: Mapping[str, Any], num_workers: int) -> Sequence[Mapping[str, Any]]:
        """Refuses a state dict that is not a multi-process collector's of ``num_workers``; returns its workers'."""
        missing = {"frames", "batches", "policy_version", "workers"} - set(state_dict)
        if missing:
            raise ConfigurationError.bad_value(
                "state_dict", sorted(state_dict), f"a multi-process collector state dict (missing {sorted(missing)})"
            )
        workers = state_dict["workers"]
        if not isinstance(workers, Sequence) or len(workers) != num_workers:
            raise ConfigurationError.bad_value(
                "state_dict['workers']", workers, f"a list of {num_workers} worker states (one per worker)"
            )
        return workers

    # -- pushes --------------------------------------------------------------------------------
    def pushed(self, batches: int) -> None:
        """A push went out after ``batches`` batches (what ``max_weight_update_interval`` counts from)."""
        self._last_push = batches

    def push_due(self, batches: int, settings: ProcessSettings, policy: object) -> bool:
        """Whether the collector pushes its policy's weights before the batch that follows ``batches`` batches
        (``update_after_each_batch``, ``max_weight_update_interval``; only a policy that is a module has any)."""
        if not isinstance(policy, torch.nn.Module):
            return False
        interval = settings.max_weight_update_interval
        return (settings.update_after_each_batch and batches > 0) or (
            interval is not None and batches - self._last_push >= interval
        )

    async def apply(self, pool: WorkerPool, push: Push, num_workers: int) -> None:
        """Sends what waits to the workers ready for it (counters, seed), and pushes the weights staged."""
        state, self._state = self._state, None
        if state is not None:
            for handle, counters in zip(pool.handles, state, strict=True):
                handle.batches.restore_counters(int(counters["next_traj_counter"]), int(counters["frames"]))
                fields = {"next_traj_counter": handle.batches.traj_counter, "frames": handle.batches.frames}
                # A worker restarting now is not connected yet (a message to it would fail, and read as its
                # death): its successor starts from these counters, passed with its config.
                if handle.ready:
                    await pool.send(handle, P.LOAD_STATE, fields)
        seed, self._seed = self._seed, None
        if seed is not None:
            for handle in pool.handles:
                if handle.ready:  # a successor not connected yet starts from a fresh reset of its own
                    await pool.send(handle, P.SEED, {"seed": seed})
                seed += handle.hello.n_envs
        weights, self._weights = self._weights, None
        if weights is not None:
            await push({"policy": params_of("state_dict", weights)}, range(num_workers), 30.0)
