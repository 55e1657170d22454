"""The task of each coroutine env, in the coroutine-env engine: its action, its step, its row of the batch.

Env ``i``'s task (:meth:`EnvSteps.run`) waits for its action (:class:`~acollect._rollout.env_turns.EnvTurns`),
awaits its
``step`` (and its ``reset`` when the episode ended, in the same step), writes the step into its row of the ring
(:class:`~acollect._rollout.row_ring.RowRing`) and waits again. Each env's trajectory id and length are kept by
:class:`~acollect._rollout.trajectories.Trajectories`, which also says when a trajectory is cut.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np

from acollect._rollout.env_faults import EnvFaults
from acollect._rollout.env_turns import EnvTurns
from acollect._rollout.row_ring import RowRing
from acollect._rollout.trajectories import Trajectories
from acollect.envs import AsyncEnvPool

__all__ = ["EnvSteps"]


class EnvSteps:
    """Steps each env of a pool as a task of its own, and holds each env's current observation.

    Args:
        pool: the envs.
        ring: the rows the steps are written into.
        turns: where each env's actions come from.
        trajectories: the envs' trajectories: one that reaches its length limit ends truncated, and its env is reset.
        faults: where an exception of an env's ``step`` or ``reset`` goes (``env_errors="restart"``): that env alone
            is rebuilt by the pool and reset, its episode in flight ending as truncated at its last step recorded
            (:mod:`acollect._rollout.env_faults`); ``None``: the exception is raised.

    Attributes:
        obs_keys: the observation keys, in the order the pool writes them.
        root_np: each observation key's current values, ``[n_envs, ...]`` (numpy views): what the policy sees.
        steps: env steps taken so far.
    """

    def __init__(
        self,
        pool: AsyncEnvPool,
        ring: RowRing,
        turns: EnvTurns,
        trajectories: Trajectories,
        faults: EnvFaults | None = None,
    ) -> None:
        self.pool, self.ring, self.turns, self.trajectories = pool, ring, turns, trajectories
        self.faults = faults
        self.lives = np.zeros(pool.num_envs, dtype=np.int64)  # each env's steps: a fault after one is not in a row
        self.obs_keys: list[tuple[str, ...]] = [leaf.key for leaf in pool.leaves]
        self.root = pool.make_root()  # the tensors root_np views
        self.root_np = [self.root.get(key).numpy() for key in self.obs_keys]
        self.steps = 0

    async def reset_all(self, seed: int | None) -> None:
        """Resets every env concurrently (env ``i`` with ``seed + i``); every env begins a new trajectory.

        The first failure cancels the other resets and is raised as it is.
        """
        pool = self.pool
        obs: list[Any] = [None] * pool.num_envs
        failures: list[BaseException] = []

        async def reset_one(i: int, scope: anyio.CancelScope) -> None:
            try:
                try:
                    obs[i] = await pool.call_reset(i, None if seed is None else seed + i)
                except Exception as exc:
                    if self.faults is None:
                        raise
                    obs[i] = await self._rebuilt(i, exc)
            except Exception as exc:
                failures.append(exc)
                scope.cancel()

        async with anyio.create_task_group() as tg:
            for i in range(pool.num_envs):
                tg.start_soon(reset_one, i, tg.cancel_scope)
        if failures:
            raise failures[0]
        for i, one in enumerate(obs):
            pool.checker.write_obs(i, "reset", one, self.root_np, i)
        self.trajectories.start_all()

    async def _rebuilt(self, i: int, error: Exception) -> Any:
        """Env ``i`` raised ``error``: the pool rebuilds it and it is reset; returns its first observation.

        Raises:
            Exception: the last exception, once the rebuilds in a row are spent (see
                :class:`~acollect._rollout.env_faults.EnvFaults`).
        """
        assert self.faults is not None
        first: list[Any] = []

        async def restart() -> None:
            await self.pool.rebuild(i)
            first[:] = [await self.pool.call_reset(i)]

        await self.faults.arecover(i, error, steps=int(self.lives[i]), restart=restart)
        return first[0]

    def _end_in_flight(self, i: int) -> None:
        """Env ``i``'s episode in flight ends as truncated at its last step, where that step is in a batch not
        handed out yet (else the new trajectory id alone marks the end)."""
        col = self.ring.last_col(i)
        if col is not None and self.trajectories.lengths[i] > 0:  # 0: that step ended its episode already
            views = self.ring.views
            views["truncated"][i, col] = views["done"][i, col] = True

    async def run(self, i: int) -> None:
        """Env ``i``'s task: forever, its action, its step (and reset), the step written into its row."""
        pool, checker, ring, turns, views = self.pool, self.pool.checker, self.ring, self.turns, self.ring.views
        reward, terminated, truncated, done = views["reward"], views["terminated"], views["truncated"], views["done"]
        next_obs, root = views["next_obs"], self.root_np
        trajectories = self.trajectories
        faults, lives = self.faults, self.lives
        while True:
            action = await turns.action_for(i)
            col = int(ring.cols[i])
            try:
                obs, r, term, trunc = checker.split_step(i, await pool.call_step(i, action))
            except Exception as exc:
                if faults is None:
                    raise
                # The failed step yields no frame: the rebuilt env's first action fills the same column.
                self._end_in_flight(i)
                obs = await self._rebuilt(i, exc)
                trajectories.start(i)
                checker.write_obs(i, "reset", obs, root, i)
                turns.stepped(i, goes_on=True)
                continue
            checker.write_obs(i, "step", obs, next_obs, (i, col))
            self.steps += 1
            lives[i] += 1
            if trajectories.count_step(i):  # its trajectory is full: this step ends it (truncated, unless terminated)
                trunc = trunc or not term
            ended = term or trunc
            reward[i, col], terminated[i, col], truncated[i, col], done[i, col] = r, term, trunc, ended
            if ended:
                try:
                    obs = await pool.call_reset(i)
                except Exception as exc:
                    if faults is None:
                        raise
                    obs = await self._rebuilt(i, exc)  # its episode ended with this step anyway
                trajectories.start(i)
            checker.write_obs(i, "reset" if ended else "step", obs, root, i)
            turns.stepped(i, goes_on=ring.advance(i))
