"""The rollout spec: what an engine is built from, made once by the collector and carried whole to the engine.

Examples:
    >>> from acollect.testing import CountingEnv
    >>> spec = RolloutSpec(create_env_fn=CountingEnv, frames_per_batch=8, max_frames_per_traj=5)
    >>> spec.max_frames_per_traj, spec.env_errors
    (5, 'raise')
    >>> spec.trajectories(n_envs=2).max_length
    5
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tensordict.nn import InteractionType

from acollect._rollout.trajectories import Trajectories

__all__ = ["RolloutSpec"]


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """What an engine is built from: the env, its policy, and how batches are collected.

    The collector makes it once from its checked options (``RolloutSettings.rollout_spec``), one per worker,
    and it travels whole to where the engine is built: in this process, in a worker process (inside its
    :class:`~acollect._workers.protocol.WorkerConfig`) or on another host.

    Attributes:
        create_env_fn: an env, a gymnasium id, or a callable returning an env (:func:`~acollect.envs.make_env`).
        frames_per_batch: the frames asked of the engine per batch (a worker's share): its envs take
            :meth:`BatchPlan(frames_per_batch).time_steps(n_envs) <acollect._batches.plan.BatchPlan.time_steps>`
            steps each, asked once the env is built.
        env_kwargs: keyword arguments for building the env.
        policy: the policy (:func:`~acollect._policy.wrap_policy`); ``None``: random actions.
        policy_factory: a zero-argument callable building the policy where the engine runs, instead of ``policy``
            (a worker resolves an import path ``"module:name"`` before it builds its engine).
        devices: the devices given (``device``, ``env_device``, ``policy_device``, ``storing_device``).
        max_frames_per_traj: truncate (and reset) trajectories longer than this.
        init_random_frames: act randomly until this many frames were collected.
        reset_at_each_iter: reset every env at the start of each batch (refused for coroutine envs).
        exploration_type: the tensordict interaction type set while the policy runs.
        traj_id_offset: the first trajectory id; with ``traj_id_stride`` it keeps the ids of workers apart.
        traj_id_stride: the step between consecutive trajectory ids.
        env_errors: ``"raise"``: an exception of the env breaks the engine; ``"restart"``: the env is rebuilt from
            ``create_env_fn`` and collection goes on (:mod:`acollect._rollout.env_faults`; coroutine envs one by one, by
            their pool).
    """

    create_env_fn: Any
    frames_per_batch: int
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    policy: Any = None
    policy_factory: Callable[[], Any] | str | None = None
    devices: Mapping[str, Any] = field(default_factory=dict)
    max_frames_per_traj: int | None = None
    init_random_frames: int = 0
    reset_at_each_iter: bool = False
    exploration_type: InteractionType | None = InteractionType.RANDOM
    traj_id_offset: int = 0
    traj_id_stride: int = 1
    env_errors: str = "raise"

    def trajectories(self, n_envs: int) -> Trajectories:
        """The trajectories of an engine's ``n_envs`` envs: their ids from ``traj_id_offset`` by ``traj_id_stride``,
        each cut at ``max_frames_per_traj`` steps (both engines make theirs here, so they read these options once)."""
        return Trajectories(n_envs, self.traj_id_offset, self.traj_id_stride, max_length=self.max_frames_per_traj)
