"""``make_env``: one entry point that turns whatever a user passes as an env into an :class:`EnvBase`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium.vector import VectorEnv

from acollect.envs._async_env import AsyncEnv
from acollect.envs._base import EnvBase
from acollect.envs._envpool import EnvPoolEnv, is_envpool_env
from acollect.envs._gym import GymEnv, check_env_id
from acollect.envs._torchrl import TorchRLEnvAdapter, is_torchrl_env
from acollect.errors import ConfigurationError

__all__ = ["check_env_arg", "known_num_envs", "make_env"]

_EXPECTED = (
    "an acollect EnvBase, a gymnasium id, a gymnasium Env or VectorEnv, an EnvPool env, a torchrl env, "
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
            * an EnvPool env (``envpool.make_gymnasium(...)``) -> :class:`~acollect.envs.EnvPoolEnv`
              (``EnvPoolEnv(env, **env_kwargs)``);
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
        if isinstance(made, AsyncEnv):
            raise ConfigurationError(
                f"create_env_fn={create_env_fn!r} returned a coroutine env ({type(made).__name__}): wrap it in a pool, "
                f"create_env_fn=lambda: AsyncEnvPool({type(made).__name__}, num_envs=...)"
            )
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
    if is_envpool_env(obj):  # before gymnasium's types: EnvPool's envs are gymnasium Envs (or VectorEnvs) too
        return EnvPoolEnv(obj, **env_kwargs)
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


# -- what can be known of an env argument without building it ------------------------------------
def _gym_call(create_env_fn: Any) -> tuple[str, dict[str, Any]] | None:
    """``(id, keyword arguments)`` when ``create_env_fn`` builds a gymnasium id: the id itself, or
    ``functools.partial(GymEnv | gymnasium.make, "Id", ...)``."""
    if isinstance(create_env_fn, str):
        return create_env_fn, {}
    if (
        isinstance(create_env_fn, functools.partial)
        and create_env_fn.func in (GymEnv, gym.make)
        and create_env_fn.args
        and isinstance(create_env_fn.args[0], str)
    ):
        return create_env_fn.args[0], dict(create_env_fn.keywords)
    return None


def check_env_arg(create_env_fn: Any, name: str = "create_env_fn") -> None:
    """Checks, without building it, what can be checked of an env argument: a gymnasium id must be registered.

    Raises:
        ConfigurationError: an id (given as is, or in ``functools.partial(GymEnv, id, ...)``) that
            ``gymnasium.make`` would not find; the message names the closest registered one.
    """
    call = _gym_call(create_env_fn)
    if call is not None:
        check_env_id(call[0], name)


def known_num_envs(create_env_fn: Any, env_kwargs: Mapping[str, Any]) -> int | None:
    """How many envs ``make_env(create_env_fn, **env_kwargs)`` will step, if it is known without building it.

    Known for an env instance (EnvPool's included), a gymnasium id, and ``functools.partial(GymEnv, id, ...)``;
    ``None`` otherwise (a factory must be called to learn it).

    Examples:
        >>> known_num_envs("CartPole-v1", {"num_envs": 4}), known_num_envs(lambda: None, {})
        (4, None)
    """
    if isinstance(create_env_fn, EnvBase):
        return create_env_fn.num_envs
    if is_envpool_env(create_env_fn):
        return int(create_env_fn.config["num_envs"])
    if isinstance(create_env_fn, VectorEnv):
        return int(create_env_fn.num_envs)
    if isinstance(create_env_fn, gym.Env):
        return 1
    call = _gym_call(create_env_fn)
    if call is None or (isinstance(create_env_fn, functools.partial) and create_env_fn.func is not GymEnv):
        return None
    n = {**call[1], **env_kwargs}.get("num_envs")
    if n is None:
        return 1
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None  # a bad value: GymEnv says so
