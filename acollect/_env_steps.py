"""The task of each coroutine env, in the coroutine-env engine: its action, its step, its row of the batch.

Env ``i``'s task (:meth:`EnvSteps.run`) waits for its action (:class:`~acollect._env_turns.EnvTurns`), awaits its
``step`` (and its ``reset`` when the episode ended, in the same step), writes the step into its row of the ring
(:class:`~acollect._row_ring.RowRing`) and waits again. :class:`Trajectories` keeps each env's trajectory id and
length, and the ids handed out, so that ids stay unique across workers.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np

from acollect._env_turns import EnvTurns
from acollect._row_ring import RowRing
from acollect.envs.async_pool import AsyncEnvPool

__all__ = ["EnvSteps", "Trajectories"]


class Trajectories:
    """The trajectory of each env (its id and length so far), and how many ids were handed out.

    Args:
        n_envs: how many envs.
        offset: the first id; with ``stride`` it keeps the ids of workers apart.
        stride: the step between consecutive ids.

    Examples:
        >>> trajectories = Trajectories(2, offset=1, stride=4)  # worker 1 of 4
        >>> trajectories.start_all()
        >>> trajectories.ids.tolist(), trajectories.new_id(), trajectories.counter
        ([1, 5], 9, 3)
    """

    def __init__(self, n_envs: int, offset: int, stride: int) -> None:
        self.offset, self.stride = offset, stride
        #: how many ids were handed out
        self.counter = 0
        #: each env's trajectory id
        self.ids = np.zeros(n_envs, dtype=np.int64)
        #: each env's steps in its trajectory so far
        self.lengths = np.zeros(n_envs, dtype=np.int64)

    def new_id(self) -> int:
        """Hands out the next id."""
        self.counter += 1
        return self.offset + self.stride * (self.counter - 1)

    def start_all(self) -> None:
        """Every env begins a new trajectory (after a reset of all)."""
        self.ids[:] = [self.new_id() for _ in range(len(self.ids))]
        self.lengths[:] = 0


class EnvSteps:
    """Steps each env of a pool as a task of its own, and holds each env's current observation.

    Args:
        pool: the envs.
        ring: the rows the steps are written into.
        turns: where each env's actions come from.
        trajectories: the envs' trajectories.
        max_frames_per_traj: truncate (and reset) trajectories longer than this.

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
        max_frames_per_traj: int | None,
    ) -> None:
        self.pool, self.ring, self.turns, self.trajectories = pool, ring, turns, trajectories
        self.max_frames_per_traj = max_frames_per_traj
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
                obs[i] = await pool.call_reset(i, None if seed is None else seed + i)
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

    async def run(self, i: int) -> None:
        """Env ``i``'s task: forever, its action, its step (and reset), the step written into its row."""
        pool, checker, ring, turns, views = self.pool, self.pool.checker, self.ring, self.turns, self.ring.views
        reward, terminated, truncated, done = views["reward"], views["terminated"], views["truncated"], views["done"]
        next_obs, root = views["next_obs"], self.root_np
        trajectories, lengths = self.trajectories, self.trajectories.lengths
        max_traj = self.max_frames_per_traj
        while True:
            action = await turns.action_for(i)
            col = int(ring.cols[i])
            obs, r, term, trunc = checker.split_step(i, await pool.call_step(i, action))
            checker.write_obs(i, "step", obs, next_obs, (i, col))
            self.steps += 1
            steps = lengths[i] + 1
            if max_traj is not None and steps >= max_traj:
                trunc = trunc or not term
            reward[i, col], terminated[i, col], truncated[i, col], done[i, col] = r, term, trunc, term or trunc
            if term or trunc:
                obs = await pool.call_reset(i)
                trajectories.ids[i] = trajectories.new_id()
                steps = 0
            checker.write_obs(i, "reset" if steps == 0 else "step", obs, root, i)
            lengths[i] = steps
            turns.stepped(i, goes_on=ring.advance(i))
