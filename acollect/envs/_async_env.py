"""Coroutine environments: the :class:`AsyncEnv` interface and the checks on what its coroutines return.

An :class:`AsyncEnv` is one environment whose ``reset`` and ``step`` are
coroutines with gymnasium's signatures and return values. It suits envs that
wait rather than compute: a simulator behind a network service, a robot, a
game server, a language model behind an API. Many of them run concurrently on
one event loop in an :class:`~acollect.envs.AsyncEnvPool`.

:class:`StepChecker` checks every value an env returns (the tuple, each
observation leaf's shape and dtype, the reward, the two flags) and writes it
into numpy views; a value that breaks the contract becomes an
:class:`~acollect.errors.EnvError` naming the env index and the field.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from acollect.envs._gym_spaces import ObsLeaf, pick_leaf
from acollect.errors import ConfigurationError, EnvError

__all__ = ["AsyncEnv", "StepChecker", "check_async_env"]


class AsyncEnv:
    """One environment stepped with coroutines, with gymnasium's signatures.

    Subclass it, set :attr:`observation_space` and :attr:`action_space` (any spaces
    :class:`~acollect.envs.GymEnv` maps: ``Box``, ``Discrete``, ``MultiDiscrete``,
    ``MultiBinary``, ``Dict``/``Tuple`` of these) and write :meth:`reset` and
    :meth:`step` as ``async def``. Open connections in the first :meth:`reset` (it runs
    on the event loop that steps the env) and close them in :meth:`aclose`.

    Actions of a ``Discrete`` space arrive as Python ints, others as numpy arrays.

    Examples:
        >>> import anyio, gymnasium, numpy as np
        >>> class Counter(AsyncEnv):
        ...     observation_space = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)
        ...     action_space = gymnasium.spaces.Discrete(2)
        ...     async def reset(self, *, seed=None, options=None):
        ...         self.n = 0
        ...         return np.zeros(1, np.float32), {}
        ...     async def step(self, action):
        ...         await anyio.sleep(0)  # a network round trip, say
        ...         self.n += 1
        ...         return np.full(1, self.n, np.float32), 1.0, self.n == 3, False, {}
        >>> async def main():
        ...     env = Counter()
        ...     await env.reset()
        ...     return [(await env.step(0))[2] for _ in range(3)]
        >>> anyio.run(main)
        [False, False, True]
    """

    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Starts an episode; returns ``(observation, info)``."""
        raise NotImplementedError

    async def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Takes one step; returns ``(observation, reward, terminated, truncated, info)``."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Releases what the env holds (connections, sessions). The default does nothing."""


def check_async_env(env: object, made_by: object) -> AsyncEnv:
    """Checks that ``env`` is an :class:`AsyncEnv` with coroutine ``reset``/``step`` and gymnasium spaces.

    Raises:
        ConfigurationError: naming what ``made_by`` built and what is wrong with it.

    Examples:
        >>> check_async_env(object(), "make_env")
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: make_env built object(...): expected an acollect.envs.AsyncEnv ...
    """
    name = type(env).__name__
    if not isinstance(env, AsyncEnv):
        shown = f"{name}(...)"
        raise ConfigurationError(
            f"{made_by} built {shown}: expected an acollect.envs.AsyncEnv (a class with async def reset and "
            "async def step); wrap a blocking gymnasium env with acollect.envs.GymEnv instead"
        )
    for method in ("reset", "step", "aclose"):
        if not inspect.iscoroutinefunction(getattr(env, method)):
            raise ConfigurationError(
                f"{name}.{method} is not a coroutine function: an AsyncEnv defines it with 'async def' "
                f"(a blocking env belongs in acollect.envs.GymEnv, which steps it off the event loop)"
            )
    for attr in ("observation_space", "action_space"):
        if not isinstance(getattr(env, attr, None), gym.Space):
            raise ConfigurationError.bad_value(f"{name}.{attr}", getattr(env, attr, None), "a gymnasium.spaces.Space")
    return env


class StepChecker:
    """Checks what an env's ``reset``/``step`` returned and writes it into numpy arrays.

    Args:
        leaves: the observation leaves (where each lives in a TensorDict, how to reach it).
        shapes: each leaf's shape for one env.
        dtypes: each leaf's numpy dtype.
        names: each env's class name (for messages).
    """

    __slots__ = ("dtypes", "flat", "leaves", "names", "shapes")

    def __init__(
        self,
        leaves: Sequence[ObsLeaf],
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[np.dtype[Any]],
        names: Sequence[str],
    ) -> None:
        self.leaves, self.shapes, self.dtypes, self.names = list(leaves), list(shapes), list(dtypes), list(names)
        self.flat = len(self.leaves) == 1 and self.leaves[0].path == ()

    def _bad(self, i: int, method: str, field: str, value: Any, expected: str) -> EnvError:
        shown = (
            f"an array of shape {value.shape} and dtype {value.dtype}"
            if isinstance(value, np.ndarray)
            else (f"{type(value).__name__} {value!r}"[:200])
        )
        return EnvError(f"env {i} ({self.names[i]}).{method} returned {field} = {shown}: expected {expected}")

    def write_obs(self, i: int, method: str, obs: Any, views: Sequence[np.ndarray], index: Any) -> None:
        """Checks observation ``obs`` of env ``i`` and writes each leaf to ``views[k][index]``."""
        for k, (leaf, view) in enumerate(zip(self.leaves, views, strict=True)):
            try:
                value = obs if self.flat else pick_leaf(obs, leaf.path)
            except (KeyError, IndexError, TypeError):
                raise self._bad(i, method, "observation", obs, f"a value of {'/'.join(leaf.key)}") from None
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            field = "observation" if self.flat else f"observation[{'/'.join(leaf.key)}]"
            if value.shape != self.shapes[k]:
                raise self._bad(i, method, field, value, f"shape {self.shapes[k]} (the observation_space's)")
            if value.dtype != self.dtypes[k] and not np.can_cast(value.dtype, self.dtypes[k], "same_kind"):
                raise self._bad(i, method, field, value, f"dtype {self.dtypes[k]} (the observation_space's)")
            view[index] = value

    def split_step(self, i: int, result: Any) -> tuple[Any, float, bool, bool]:
        """Checks ``step``'s 5-tuple of env ``i``; returns ``(obs, reward, terminated, truncated)``."""
        if type(result) is not tuple or len(result) != 5:
            raise self._bad(i, "step", "a result", result, "a tuple (observation, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, _ = result
        if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
            if not (isinstance(reward, np.ndarray) and reward.size == 1 and reward.dtype.kind in "fiu"):
                raise self._bad(i, "step", "reward", reward, "a real number")
        for field, flag in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(flag, (bool, np.bool_)):
                raise self._bad(i, "step", field, flag, "a bool")
        return obs, float(reward), bool(terminated), bool(truncated)

    def split_reset(self, i: int, result: Any) -> Any:
        """Checks ``reset``'s pair of env ``i``; returns the observation."""
        if type(result) is not tuple or len(result) != 2:
            raise self._bad(i, "reset", "a result", result, "a tuple (observation, info)")
        return result[0]
