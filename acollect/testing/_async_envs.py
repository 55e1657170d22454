"""Coroutine envs for tests: :class:`AsyncCountingEnv`, slow, crashing or hanging on demand.

They sleep with ``anyio.sleep``, so they run under asyncio and trio alike.
"""

from __future__ import annotations

from typing import Any

import anyio
import gymnasium as gym
import numpy as np

from acollect.envs import AsyncEnv

__all__ = ["AsyncCountingEnv"]


class AsyncCountingEnv(AsyncEnv):
    """A coroutine env whose observation counts the steps of its episode.

    Each step returns ``[n]`` (float32, ``n`` = steps since the reset), reward 1.0, and
    ``terminated=True`` at ``episode_length``. The action (``Discrete(2)``) is recorded, not used.

    Args:
        episode_length: steps per episode.
        step_time: seconds each step sleeps (``anyio.sleep``), or a callable returning them.
        reset_time: seconds each reset sleeps.
        crash_at_step: the step (counted from 1, across episodes) that raises ``RuntimeError``.

    Attributes:
        actions: every action received.
        resets: the seeds of every reset.
        closes: how many times ``aclose()`` ran (:attr:`closed`: whether it did).

    Examples:
        >>> import anyio
        >>> async def main():
        ...     env = AsyncCountingEnv(episode_length=2)
        ...     await env.reset()
        ...     return [(await env.step(1))[:4] for _ in range(2)]
        >>> [(obs.tolist(), r, term) for obs, r, term, _ in anyio.run(main)]
        [([1.0], 1.0, False), ([2.0], 1.0, True)]
    """

    observation_space = gym.spaces.Box(-1e9, 1e9, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(
        self,
        episode_length: int = 10,
        *,
        step_time: float | Any = 0.0,
        reset_time: float = 0.0,
        crash_at_step: int | None = None,
    ) -> None:
        self.episode_length = episode_length
        self.step_time = step_time
        self.reset_time = reset_time
        self.crash_at_step = crash_at_step
        self.actions: list[Any] = []
        self.resets: list[int | None] = []
        self.closes = 0  # counted, not a flag: a test can see that a pool closed each env once
        self.steps_taken = 0
        self._n = 0

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if self.reset_time:
            await anyio.sleep(self.reset_time)
        self.resets.append(seed)
        self._n = 0
        return np.zeros(1, np.float32), {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        delay = self.step_time() if callable(self.step_time) else self.step_time
        if delay:
            await anyio.sleep(delay)
        self.steps_taken += 1
        if self.crash_at_step is not None and self.steps_taken == self.crash_at_step:
            raise RuntimeError(f"AsyncCountingEnv crashed at step {self.steps_taken}")
        self.actions.append(action)
        self._n += 1
        return np.full(1, self._n, np.float32), 1.0, self._n >= self.episode_length, False, {}

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` ran."""
        return self.closes > 0

    async def aclose(self) -> None:
        self.closes += 1
