"""Seeds and state of the multi-process collectors: what ``set_seed``, ``state_dict`` and ``load_state_dict`` do.

Each is staged here and reaches the workers at the next batch boundary (see
:class:`~acollect.collectors._multi_base.MultiCollectorBase`, which applies what is pending).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect._validate import check_int
from acollect._warnings import warn
from acollect.envs.envpool import reseed_error, shared_seeds_warning
from acollect.errors import ConfigurationError
from acollect.pool import WorkerPool
from acollect.worker import protocol as P

__all__ = ["MultiStateMixin"]


class MultiStateMixin:
    """Seeds, counters and weights saved and restored (mixed into the multi-process collectors)."""

    _pool: WorkerPool | None
    _configs: list[P.WorkerConfig]
    _policy_arg: Any
    _pending_seed: int | None
    _pending_state: Mapping[str, Any] | None
    _pending_weights: TensorDictBase | None
    _initial_version: int
    _frames: int
    _batches: int

    if TYPE_CHECKING:  # the collector's own (declared for the type checker only: they must not shadow it)

        @property
        def num_workers(self) -> int: ...

        @property
        def policy_version(self) -> int: ...

        def _check_usable(self, action: str, *, allow_broken: bool = False) -> None: ...

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
        self._check_usable("set_seed()")
        self._refuse_seed_of_built_envs(seed)
        self._pending_seed = seed
        if self._pool is not None and all(h.n_envs for h in self._pool.handles):
            return seed + sum(h.n_envs for h in self._pool.handles)
        return seed + self.num_workers

    def _refuse_seed_of_built_envs(self, seed: int) -> None:
        """Raises where a worker's env was seeded when built (EnvPool): its reset takes no seed."""
        seeds = [h.env_seed for h in self._pool.handles] if self._pool is not None else []
        if any(s is not None for s in seeds):
            raise reseed_error(seed, seeds)

    def _check_env_seeds(self) -> None:
        """Once every worker said hello: refuses a seed staged before, and warns of workers whose envs share seeds.

        Only the workers know what their envs were built with (an EnvPool env's seed); said here, on the event
        loop, the error and the warning point at the user's ``async with`` / ``async for``, and a reseed never
        reaches a worker to fail there at the next batch.
        """
        pool = self._pool
        assert pool is not None
        if self._pending_seed is not None:
            try:
                self._refuse_seed_of_built_envs(self._pending_seed)
            except ConfigurationError:
                self._pending_seed = None  # refused: entering again starts without it
                raise
        message = shared_seeds_warning([(h.env_seed, h.n_envs) for h in pool.handles])
        if message is not None:
            warn(f"{type(self).__name__}: {message}")

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
