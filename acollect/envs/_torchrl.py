"""Adapter for TorchRL envs: a ``torchrl.envs.EnvBase`` behind acollect's batched env protocol.

TorchRL is optional: this module never imports it. A TorchRL env is recognised
by its attributes (:func:`is_torchrl_env`), its specs are mapped by shape and
dtype, and stepping goes through its own ``step_and_maybe_reset``, so its
transforms, batched envs (``SerialEnv``, ``ParallelEnv``) and reset logic all
work as they do in TorchRL. Its ``action_keys``, ``reward_keys`` and ``done_keys`` come through as they are,
nested ones included (a multi-agent env's ``("agents", "action")``, ``("agents", "reward")``,
``("agents", "done")``): acollect's env protocol takes them as composite specs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect.envs._base import DONE_KEYS, EnvBase
from acollect.errors import ConfigurationError, EnvError
from acollect.specs import Composite, TensorSpec, Unbounded

__all__ = ["TorchRLEnvAdapter", "is_torchrl_env"]


def is_torchrl_env(obj: object) -> bool:
    """Whether ``obj`` looks like a TorchRL env (without importing torchrl).

    Examples:
        >>> from acollect.testing import CountingEnv
        >>> is_torchrl_env(CountingEnv())
        False
    """
    if isinstance(obj, type) or isinstance(obj, EnvBase):
        return False
    return all(hasattr(obj, name) for name in ("step_and_maybe_reset", "action_spec", "batch_size")) and (
        hasattr(obj, "full_observation_spec") or hasattr(obj, "observation_spec")
    )


def _key(key: str | tuple[str, ...]) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _nest(leaves: dict[tuple[str, ...], TensorSpec]) -> Composite:
    """A composite spec of nested leaves: ``{("agents", "action"): spec}`` to ``agents=Composite(action=spec)``."""
    spec = Composite()
    for key, leaf in leaves.items():
        node = spec
        for part in key[:-1]:
            if part not in node:
                node[part] = Composite()
            node = node[part]
        node[key[-1]] = leaf
    return spec


class TorchRLActionSpec(TensorSpec):
    """A TorchRL action spec seen through acollect's :class:`~acollect.specs.TensorSpec`.

    Shape and dtype are per sub-env; :meth:`rand` samples with TorchRL's own
    ``rand`` so every TorchRL domain (one-hot, bounded, ...) is respected.

    Attributes:
        torchrl_spec: the wrapped TorchRL spec (with the env's batch dims).
    """

    def __init__(self, torchrl_spec: Any, batch_dims: int, device: torch.device) -> None:
        super().__init__(tuple(torchrl_spec.shape)[batch_dims:], torchrl_spec.dtype, device)
        self.torchrl_spec = torchrl_spec
        self._env_batch = tuple(torchrl_spec.shape)[:batch_dims]

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        want = math.prod(batch)
        per_draw = max(math.prod(self._env_batch), 1)
        draws = -(-want // per_draw)  # ceil: each draw gives one sample per sub-env of the TorchRL env
        sample = self.torchrl_spec.rand(torch.Size([draws]))
        sample = sample.reshape(-1, *self.shape)[:want]
        return sample.reshape(*batch, *self.shape).to(self.device)

    def _extra_repr(self) -> str:
        return f"torchrl={type(self.torchrl_spec).__name__}"


class TorchRLEnvAdapter(EnvBase):
    """A TorchRL env (``torchrl.envs.EnvBase``) as a batched acollect env.

    An unbatched TorchRL env (``batch_size == []``) gets a leading batch dim of
    1; a batched one (``SerialEnv``, ``ParallelEnv``, a vectorised lib env) must
    have exactly one batch dim. The adapter owns the env: :meth:`close` closes it.

    Args:
        env: the TorchRL env instance.

    Raises:
        ConfigurationError: ``env`` is not a TorchRL env or has more than one batch dim.
    """

    def __init__(self, env: Any) -> None:
        self._env: Any = None
        if not is_torchrl_env(env):
            raise ConfigurationError.bad_value(
                "env", env, "a torchrl.envs.EnvBase instance (with step_and_maybe_reset, action_spec, batch_size)"
            )
        env_batch = tuple(env.batch_size)
        if len(env_batch) > 1:
            raise ConfigurationError.bad_value("env.batch_size", env_batch, "at most one batch dim")
        self._env = env
        self._unbatched = not env_batch
        self._k = len(env_batch)
        self.batch_size = torch.Size([1 if self._unbatched else env_batch[0]])
        self.device = torch.device(env.device) if getattr(env, "device", None) is not None else torch.device("cpu")
        obs_spec = getattr(env, "full_observation_spec", None)
        if obs_spec is None:
            obs_spec = env.observation_spec
        self._obs_keys: list[tuple[str, ...]] = [_key(k) for k in obs_spec.keys(include_nested=True, leaves_only=True)]
        self.observation_spec = _nest({key: self._unbounded(obs_spec[key]) for key in self._obs_keys})
        self._action_keys = [_key(k) for k in getattr(env, "action_keys", ["action"])]
        if self._action_keys == [("action",)]:
            self.action_spec = TorchRLActionSpec(env.action_spec, self._k, self.device)
        else:
            self.action_spec = _nest(
                {key: TorchRLActionSpec(env.full_action_spec[key], self._k, self.device) for key in self._action_keys}
            )
        self._reward_keys = [_key(k) for k in getattr(env, "reward_keys", ["reward"])]
        if self._reward_keys == [("reward",)]:
            reward = env.reward_spec
            self.reward_spec = Unbounded(tuple(reward.shape)[self._k :], dtype=reward.dtype, device=self.device)
        else:
            self.reward_spec = _nest({key: self._unbounded(env.full_reward_spec[key]) for key in self._reward_keys})
        done_spec = getattr(env, "full_done_spec", None)
        self._done_keys = [k for k in DONE_KEYS if done_spec is None or k in done_spec.keys()]
        if "done" not in self._done_keys:
            raise ConfigurationError.bad_value(
                "env", type(env).__name__, "a TorchRL env with a root 'done' flag (an episode ends when it does)"
            )
        # A group's own flags (per agent), written like observations.
        self._group_flags = [_key(k) for k in getattr(env, "done_keys", ()) if len(_key(k)) > 1]
        if self._group_flags and done_spec is not None:
            self.done_spec = _nest({key: self._unbounded(done_spec[key]) for key in self._group_flags})
        self._done_shape = tuple(done_spec["done"].shape) if done_spec is not None else (*env_batch, 1)
        self._td: TensorDictBase | None = None  # TorchRL's root: what the next step starts from

    def _unbounded(self, leaf: Any) -> Unbounded:
        return Unbounded(tuple(leaf.shape)[self._k :], dtype=leaf.dtype, device=self.device)

    @property
    def env(self) -> Any:
        """The wrapped TorchRL env."""
        return self._env

    def _write(self, src: TensorDictBase, out: TensorDictBase, keys: list[tuple[str, ...]], rows: Any) -> None:
        for key in keys:
            target = out.get(key)
            value = src.get(key).reshape(target.shape).to(target.device)
            if rows is None:
                target.copy_(value)
            else:
                target[rows] = value[rows]

    def _write_flags(self, src: TensorDictBase, out: TensorDictBase, rows: Any) -> None:
        self._write(src, out, [*((k,) for k in self._done_keys), *self._group_flags], rows)
        if "truncated" not in self._done_keys:
            # An env without a truncated flag never truncates: done and not terminated cannot happen.
            target = out.get("truncated")
            if rows is None:
                target.zero_()
            else:
                target[rows] = False

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        if seed is not None:
            self._env.set_seed(seed)
        rows = None
        previous = self._td
        picked = self._mask_rows(mask) if previous is not None else None
        if picked is not None:
            if not picked.any():
                return
            rows = torch.from_numpy(picked).to(self.device)
        if rows is None or previous is None:
            td = self._env.reset()
        else:
            request = previous.exclude(*self._action_keys)
            request.set("_reset", rows.reshape(self._done_shape))
            fresh = self._env.reset(request)
            # Keep the untouched sub-envs exactly as they were, whatever the env returned for them.
            td = previous.clone()
            for key in [*self._obs_keys, *((k,) for k in self._done_keys), *self._group_flags]:
                td.get(key)[rows] = fresh.get(key)[rows]
        self._td = td
        self._write(td, out, self._obs_keys, rows)
        self._write_flags(td, out, rows)

    def step_and_reset_into(self, action: Any, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._check_open()
        if self._td is None:
            raise EnvError("TorchRLEnvAdapter was stepped before reset_into(): reset it first.")
        td = self._td
        if isinstance(action, TensorDictBase):  # every action key
            td.update(action[0] if self._unbatched else action)
        else:
            td.set(self._action_keys[0], action[0] if self._unbatched else action)
        stepped, root = self._env.step_and_maybe_reset(td)
        nxt = stepped.get("next")
        self._write(nxt, next_out, self._obs_keys, None)
        for key in self._reward_keys:
            target = next_out.get(key)
            target.copy_(nxt.get(key).reshape(target.shape))
        self._write_flags(nxt, next_out, None)
        self._write(root, root_out, self._obs_keys, None)
        self._write_flags(root, root_out, None)
        self._td = root

    def _close(self) -> None:
        self._td = None
        if self._env is not None and not getattr(self._env, "is_closed", False):
            self._env.close()

    def __repr__(self) -> str:
        return f"TorchRLEnvAdapter(env={type(self._env).__name__}, num_envs={self.num_envs})"
