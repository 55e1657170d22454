"""Test envs that are ``gymnasium.Env`` subclasses, for code that wraps gymnasium envs (vector envs in every autoreset
mode).

* :class:`CountingGymEnv`: the counting scheme of :mod:`acollect.testing._envs` (a counter as observation: a
  step adds 1, a reset ``RESET_JUMP``, sub-env ``i`` starts at ``i * ENV_STRIDE``), so
  :func:`~acollect.testing.assert_counting_batch` checks what a collector made of it;
* :class:`CrashingGymEnv`: a counting one that raises at a chosen step of its life;
* :class:`EchoGymEnv`: its next observation holds the action it received, so a batch shows whether the env
  acted on the action it records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from acollect.testing._envs import ENV_STRIDE, RESET_JUMP, positive_int

__all__ = ["CountingGymEnv", "CrashingGymEnv", "EchoGymEnv"]


class CountingGymEnv(gym.Env[np.ndarray, np.int64]):
    """The counting scheme as a single ``gymnasium.Env``: observation float32 ``(1,)``, action ``Discrete(2)``.

    Use :meth:`env_fns` to build vector envs whose sub-envs count on distinct ranges.

    Args:
        episode_length: steps per episode (then ``terminated=True``).
        start: the first observation (the first reset's).

    Examples:
        >>> from gymnasium.vector import SyncVectorEnv
        >>> from acollect.testing import CountingGymEnv
        >>> vec = SyncVectorEnv(CountingGymEnv.env_fns(2, episode_length=3))
        >>> obs, _ = vec.reset()
        >>> obs[:, 0].tolist()
        [0.0, 1000000.0]
        >>> vec.close()
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's own convention

    def __init__(self, episode_length: int = 10, *, start: int = 0) -> None:
        self.episode_length = positive_int("episode_length", episode_length)
        big = float(np.finfo(np.float32).max)  # finite bounds: gymnasium's checker warns on infinite ones
        self.observation_space = gym.spaces.Box(-big, big, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.counter = start - RESET_JUMP
        self.episode_id = -1
        self._in_episode = 0

    @staticmethod
    def env_fns(num_envs: int, episode_length: int = 10, *, start: int = 0) -> list[Callable[[], CountingGymEnv]]:
        """Picklable factories of ``num_envs`` sub-envs, sub-env ``i`` starting at ``start + i * ENV_STRIDE``."""
        n = positive_int("num_envs", num_envs)
        return [functools.partial(CountingGymEnv, episode_length, start=start + i * ENV_STRIDE) for i in range(n)]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.counter += RESET_JUMP
        self.episode_id += 1
        self._in_episode = 0
        return np.array([self.counter], dtype=np.float32), {"episode_id": self.episode_id}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.counter += 1
        self._in_episode += 1
        terminated = self._in_episode >= self.episode_length
        return np.array([self.counter], dtype=np.float32), 1.0, terminated, False, {"episode_id": self.episode_id}


class EchoGymEnv(gym.Env[np.ndarray, np.int64]):
    """A ``gymnasium.Env`` that echoes the action it received into its next observation.

    Observation float32 ``(2,)``: ``[counter, last action received]``; action ``Discrete(n_actions)``. The counter
    starts at ``start`` and counts steps; episodes never end. A collected batch then says whether the env acted on
    the action the batch records: ``batch["next", "observation"][..., 1] == batch["action"]`` at every step. A
    policy that picks its action from the counter (``counter % n_actions``) gives every step a different action,
    so an env reading an action that has not arrived yet (a device-to-host copy not waited for) shows.

    Args:
        n_actions: size of the discrete action space.
        start: the first observation's counter.

    Examples:
        >>> from acollect.testing import EchoGymEnv
        >>> env = EchoGymEnv(n_actions=10)
        >>> env.reset()[0].tolist()
        [0.0, -1.0]
        >>> env.step(np.int64(7))[0].tolist()
        [1.0, 7.0]
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's own convention

    def __init__(self, n_actions: int = 1000, *, start: int = 0) -> None:
        self.n_actions = positive_int("n_actions", n_actions)
        big = float(np.finfo(np.float32).max)
        self.observation_space = gym.spaces.Box(-big, big, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(self.n_actions)
        self.counter = start

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.array([self.counter, -1], dtype=np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        # Not checked against the space on purpose: a garbage action is what the echo must show, not refuse.
        self.counter += 1
        return np.array([self.counter, int(action)], dtype=np.float32), 1.0, False, False, {}


class CrashingGymEnv(CountingGymEnv):
    """A :class:`CountingGymEnv` whose ``crash_at_step``-th step (of its life, across episodes) raises ``RuntimeError``.

    A new instance counts from 1 again: an env rebuilt after the crash crashes at the same step of its own life.

    Args:
        crash_at_step: the step that raises (1 = the first).
        episode_length: steps per episode (then ``terminated=True``).
        start: the first observation (the first reset's).

    Examples:
        >>> env = CrashingGymEnv(crash_at_step=2)
        >>> _ = env.reset()
        >>> _ = env.step(0)
        >>> env.step(0)
        Traceback (most recent call last):
        ...
        RuntimeError: CrashingGymEnv crashed at step 2 of its life (crash_at_step=2)
    """

    def __init__(self, crash_at_step: int, episode_length: int = 10, *, start: int = 0) -> None:
        super().__init__(episode_length, start=start)
        self.crash_at_step = positive_int("crash_at_step", crash_at_step)
        self.step_count = 0

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.step_count += 1
        if self.step_count == self.crash_at_step:
            raise RuntimeError(
                f"CrashingGymEnv crashed at step {self.step_count} of its life (crash_at_step={self.crash_at_step})"
            )
        return super().step(action)
