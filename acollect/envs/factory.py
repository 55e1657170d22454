"""``make_env``: one entry point that turns whatever a user passes as an env into an :class:`EnvBase`."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import VectorEnv

from acollect.envs.base import EnvBase
from acollect.envs.gym import GymEnv
from acollect.envs.torchrl import TorchRLEnvAdapter, is_torchrl_env
from acollect.errors import ConfigurationError

__all__ = ["make_env"]

_EXPECTED = (
    "an acollect EnvBase, a gymnasium id, a gymnasium Env or VectorEnv, a torchrl env, "
    "or a callable returning one of these"
)


def make_env(create_env_fn: Any, **env_kwargs: Any) -> EnvBase:
    """Builds an acollect env from an env, an env id or an env factory.

    Args:
        create_env_fn: one of

            * an :class:`~acollect.envs.EnvBase` (returned as is; ``env_kwargs`` must be empty);
            * a gymnasium id such as ``"CartPole-v1"`` -> ``GymEnv(id, **env_kwargs)``
              (``num_envs``, ``vectorization``, ``device``, ``gymnasium.make`` arguments);
            * a ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv`` instance -> ``GymEnv(env, **env_kwargs)``;
            * a TorchRL env -> :class:`~acollect.envs.TorchRLEnvAdapter` (``env_kwargs`` must be empty);
            * a callable (a function, a class such as ``CountingEnv``): called as
              ``create_env_fn(**env_kwargs)``, and what it returns is turned into an env as above.
        **env_kwargs: see above.

    Returns:
        The env, owned by the caller (close it when done).

    Raises:
        ConfigurationError: ``create_env_fn`` is none of the above, or ``env_kwargs`` do not apply.

    Examples:
        >>> from acollect.envs import make_env
        >>> from acollect.testing import CountingEnv
        >>> make_env(CountingEnv, num_envs=3).num_envs
        3
        >>> env = make_env("CartPole-v1", num_envs=2)
        >>> env.batch_size
        torch.Size([2])
        >>> env.close()
    """
    env = _wrap(create_env_fn, env_kwargs)
    if env is not None:
        return env
    if callable(create_env_fn):
        made = create_env_fn(**env_kwargs)
        env = _wrap(made, {})
        if env is None:
            raise ConfigurationError(
                f"create_env_fn={create_env_fn!r} returned {made!r}: expected it to return {_EXPECTED}."
            )
        return env
    raise ConfigurationError.bad_value("create_env_fn", create_env_fn, _EXPECTED)


def _wrap(obj: Any, env_kwargs: dict[str, Any]) -> EnvBase | None:
    """The env for ``obj`` if it is one of the accepted instances or an id, else ``None``."""
    if isinstance(obj, EnvBase):
        _no_kwargs(obj, env_kwargs)
        return obj
    if isinstance(obj, (str, gym.Env, VectorEnv)):
        return GymEnv(obj, **env_kwargs)
    if is_torchrl_env(obj):
        _no_kwargs(obj, env_kwargs)
        return TorchRLEnvAdapter(obj)
    return None


def _no_kwargs(obj: object, env_kwargs: dict[str, Any]) -> None:
    if env_kwargs:
        raise ConfigurationError.bad_value(
            "env_kwargs", env_kwargs, f"no arguments: {type(obj).__name__} instances are used as they are"
        )
