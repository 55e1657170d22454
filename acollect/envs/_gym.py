"""Gymnasium adapter: single envs and vector envs behind the batched env protocol.

:class:`GymEnv` wraps a gymnasium id, a ``gymnasium.Env`` instance, a factory
of ``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv`` (sync or async, any
autoreset mode), converts its spaces to :mod:`acollect.specs` and writes every
step into TensorDicts the caller allocated once.

Autoreset: gymnasium >= 1.0 vector envs default to the NEXT_STEP autoreset
mode, in which the step after an episode end is a no-op reset. :class:`GymEnv`
never lets such a transition out: in SAME_STEP mode it takes the true final
observation from ``infos["final_obs"]``, in NEXT_STEP and DISABLED modes the
step's observation *is* the final one and the finished sub-envs are reset at
once with ``reset(options={"reset_mask": done})``, which also clears
gymnasium's pending autoreset. A plain ``SyncVectorEnv`` (ours, or a user's
that no vector wrapper covers) is not stepped through its ``step()`` at all:
its sub-envs are stepped one by one straight into the TensorDicts, and a
finished one is reset at once (:mod:`acollect.envs._gym_step`), which is
cheaper and needs none of the above.

Dtypes: a float64 ``Box`` observation (every MuJoCo env's) is stored as float32
unless ``double_to_float=False``: a torch policy's parameters are float32, and a
float64 observation meeting them fails inside the policy's first layer. A
continuous action outside its ``Box`` is stored as the policy wrote it and passed
on as it is; the first such step warns (:class:`~acollect.envs._gym_step.ActionBounds`).
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from tensordict import TensorDictBase

from acollect.envs._base import DONE_KEYS, EnvBase, SubEnvFaultHandler
from acollect.envs._envpool import is_envpool_env
from acollect.envs._gym_faults import SubEnvRebuilds
from acollect.envs._gym_spaces import observation_layout, pick_leaf, space_to_spec
from acollect.envs._gym_step import ActionBounds, Binding, reshape_action, step_sub_envs
from acollect.envs._versions import installed_release
from acollect.errors import ConfigurationError, EnvError, PolicyError
from acollect.specs import (
    OneHot,
    TensorSpec,
    Unbounded,
)

__all__ = ["GymEnv", "check_env_id", "space_to_spec"]

_VECTORIZATIONS = ("sync", "async")


class GymEnv(EnvBase):
    """A gymnasium env (single or vector) as a batched acollect env.

    Args:
        env: a registered gymnasium id (``"CartPole-v1"``), a zero-argument
            callable returning a ``gymnasium.Env`` (both build a vector env of
            ``num_envs`` sub-envs), a ``gymnasium.Env`` instance (``n_envs = 1``)
            or a ``gymnasium.vector.VectorEnv`` instance, sync or async, in any
            autoreset mode. A wrapped instance is owned: :meth:`close` closes it.
        num_envs: sub-envs to build (id or callable only; default 1).
        vectorization: ``"sync"`` (``SyncVectorEnv``, in this process) or
            ``"async"`` (``AsyncVectorEnv``, one process per sub-env).
        categorical_action_encoding: a ``Discrete`` action is an int64 index
            (:class:`~acollect.specs.Categorical`) when True, a one-hot vector
            (:class:`~acollect.specs.OneHot`) when False.
        device: where the env's tensors live.
        double_to_float: store float64 ``Box`` observations (MuJoCo's) as float32, the dtype of a torch policy's
            parameters (``observation_spec`` says so, and every batch holds float32); ``False`` keeps float64, for
            a float64 policy.
        **kwargs: passed to ``gymnasium.make`` for each sub-env (id only).

    Raises:
        ConfigurationError: an unknown id, an unsupported space, arguments
            that do not fit ``env``, or an EnvPool env (its adapter is
            :class:`~acollect.envs.EnvPoolEnv`).

    Examples:
        >>> from acollect.envs import GymEnv
        >>> env = GymEnv("CartPole-v1", num_envs=4)
        >>> root = env.reset(seed=0)
        >>> root["observation"].shape, env.action_spec
        (torch.Size([4, 4]), Categorical(shape=(), dtype=torch.int64, n=2))
        >>> nxt = env.step(root.set("action", env.action_spec.rand((4,))))
        >>> nxt["reward"].shape, nxt["done"].dtype
        (torch.Size([4, 1]), torch.bool)
        >>> env.close()
        >>> from gymnasium.wrappers import TransformObservation
        >>> def pendulum64():  # float64 observations, as every MuJoCo env's
        ...     box = gym.spaces.Box(-8.0, 8.0, (3,), dtype=np.float64)
        ...     return TransformObservation(gym.make("Pendulum-v1"), lambda obs: obs.astype(np.float64), box)
        >>> with GymEnv(pendulum64) as env:
        ...     env.reset()["observation"].dtype
        torch.float32
        >>> with GymEnv(pendulum64, double_to_float=False) as env:
        ...     env.reset()["observation"].dtype
        torch.float64
    """

    action_spec: TensorSpec  # one action: these envs have no keys of their own
    reward_spec: TensorSpec

    def __init__(
        self,
        env: str | gym.Env[Any, Any] | VectorEnv[Any, Any, Any] | Callable[[], gym.Env[Any, Any]],
        *,
        num_envs: int | None = None,
        vectorization: str = "sync",
        categorical_action_encoding: bool = True,
        device: str | torch.device = "cpu",
        double_to_float: bool = True,
        **kwargs: Any,
    ) -> None:
        self._env: Any = None
        self._vec: VectorEnv[Any, Any, Any] | None = None
        self._binding: Binding | None = None
        self._sub_envs: list[Any] | None = None
        self._rebuilds: SubEnvRebuilds | None = None  # set by contain_faults()
        if vectorization not in _VECTORIZATIONS:
            raise ConfigurationError.bad_value("vectorization", vectorization, "'sync' or 'async'")
        if num_envs is not None and (isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1):
            raise ConfigurationError.bad_value("num_envs", num_envs, "a positive int")
        if not isinstance(double_to_float, bool):
            raise ConfigurationError.bad_value("double_to_float", double_to_float, "True or False")
        self.device = torch.device(device)
        if is_envpool_env(env):
            raise ConfigurationError.bad_value(
                "env", env, "a gymnasium env; an EnvPool env goes to EnvPoolEnv(env), or to a collector as it is"
            )

        if isinstance(env, VectorEnv):
            self._check_instance_args(env, kwargs, num_envs, allowed=env.num_envs)
            self._vec = self._env = env
            n = env.num_envs
            obs_space, act_space = env.single_observation_space, env.single_action_space
            self._mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
            _check_resettable(env, self._mode)
        elif isinstance(env, gym.Env):
            self._check_instance_args(env, kwargs, num_envs, allowed=1)
            self._env = env
            n = 1
            obs_space, act_space = env.observation_space, env.action_space
            self._mode = AutoresetMode.DISABLED
        elif isinstance(env, str) or callable(env):
            n = 1 if num_envs is None else num_envs
            self._vec = self._env = _build_vector_env(env, n, vectorization, kwargs)
            obs_space, act_space = self._vec.single_observation_space, self._vec.single_action_space
            self._mode = AutoresetMode.SAME_STEP
        else:
            raise ConfigurationError.bad_value(
                "env",
                env,
                "a gymnasium id, a gymnasium.Env or VectorEnv instance, or a callable returning a gymnasium.Env",
            )

        self.batch_size = torch.Size([n])
        try:
            self.observation_spec, self._leaves = observation_layout(
                obs_space, self.device, double_to_float=double_to_float
            )
            self.action_spec = space_to_spec(act_space, categorical=categorical_action_encoding, device=self.device)
            if not isinstance(self.action_spec, TensorSpec):
                raise ConfigurationError.bad_value("action_space", act_space, "a single (non Dict/Tuple) space")
        except ConfigurationError:
            # Close what we built; leave an instance the caller passed in to the caller.
            if not isinstance(env, (gym.Env, VectorEnv)):
                self._env.close()
            self._env = self._vec = None
            raise
        self.reward_spec = Unbounded((1,), dtype=torch.float32, device=self.device)
        self._one_hot = isinstance(self.action_spec, OneHot)
        self._action_shape = (n, *self.action_spec.shape)
        # Dropped once it has warned: one warning per env, and no check in the steps after it.
        self._bounds = ActionBounds.of(self.action_spec, self._action_shape)
        self._flat_obs = len(self._leaves) == 1 and self._leaves[0].path == ()
        # A plain SyncVectorEnv (not a subclass, not wrapped: nothing of its own to run) is stepped sub-env by
        # sub-env here, which is cheaper than its step() and needs no autoreset handling (see gym_step).
        self._sub_envs = list(self._vec.envs) if type(self._vec) is SyncVectorEnv else None

    @staticmethod
    def _check_instance_args(env: object, kwargs: dict[str, Any], num_envs: int | None, allowed: int) -> None:
        if kwargs:
            raise ConfigurationError.bad_value(
                "kwargs", sorted(kwargs), f"no gymnasium.make arguments when wrapping an instance ({env!r})"
            )
        if num_envs is not None and num_envs != allowed:
            raise ConfigurationError.bad_value("num_envs", num_envs, f"None or {allowed} for the instance {env!r}")

    # -- properties -------------------------------------------------------------------
    @property
    def env(self) -> Any:
        """The wrapped gymnasium env or vector env."""
        return self._env

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """The wrapped vector env's autoreset mode (``DISABLED`` for a single env: it is reset here)."""
        return self._mode

    # -- protocol -----------------------------------------------------------------------
    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        mask_np = self._mask_rows(mask)
        if mask_np is not None and not mask_np.any():
            return
        if mask_np is None and seed is not None and self._rebuilds is not None:
            self._rebuilds.reseed(seed)
        if self._vec is None:
            obs, _ = self._env.reset(seed=seed)
            obs_rows = [np.asarray(pick_leaf(obs, leaf.path))[None] for leaf in self._leaves]
        elif mask_np is None:
            obs, _ = self._vec.reset(seed=seed)
            obs_rows = [pick_leaf(obs, leaf.path) for leaf in self._leaves]
        else:
            obs, _ = self._vec.reset(seed=seed, options={"reset_mask": mask_np.copy()})
            obs_rows = [self._every_row(pick_leaf(obs, leaf.path)) for leaf in self._leaves]
        rows = slice(None) if mask_np is None else torch.from_numpy(mask_np).to(self.device)
        for leaf, value in zip(self._leaves, obs_rows, strict=True):
            target = out.get(leaf.key)
            src = torch.as_tensor(np.asarray(value)).to(device=target.device, dtype=target.dtype)
            target[rows] = src[rows].reshape(target[rows].shape)
        for key in DONE_KEYS:
            out.get(key)[rows] = False

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        # The hot path: no TensorDict access, no allocation beyond what gymnasium does; numpy writes only.
        if self._closed:
            self._check_open()
        b = self._binding
        if b is None or b.next_td is not next_out or b.root_td is not root_out:
            b = self._binding = Binding(self._leaves, self.num_envs, next_out, root_out)
        if action.requires_grad or not action.is_cpu:
            action = action.detach().cpu()
        act = action.numpy()
        if act.shape != self._action_shape:
            act = reshape_action(act, self._action_shape, self.action_spec)
        given = act
        if self._one_hot:
            act = act.argmax(-1)
        elif self._bounds is not None and not self._bounds.holds(act):
            self._bounds.warn(act)
            self._bounds = None
        # No check per step: a try costs nothing until it raises, and an env that refuses an action (gymnasium's
        # own assert `action_space.contains(action)`) is then told apart from one that broke for its own reasons.
        try:
            if self._sub_envs is not None:
                rebuilds = self._rebuilds
                if rebuilds is not None:
                    rebuilds.actions = (given, act)
                step_sub_envs(self._sub_envs, act, b, self._leaves, rebuilds.raised if rebuilds is not None else None)
            elif self._vec is None:
                obs, reward, terminated, truncated, info = self._env.step(act[0])
            else:
                obs, reward, terminated, truncated, info = self._vec.step(act)
        except Exception as exc:
            self._raise_if_outside(given, exc)
            raise
        if self._sub_envs is not None:
            for flag in b.root_flags:
                flag.fill(False)
            if b.flush_pairs:
                b.flush()
            return
        if self._flat_obs:
            b.next_obs[0][...] = obs
        else:
            for leaf, dst in zip(self._leaves, b.next_obs, strict=True):
                dst[...] = pick_leaf(obs, leaf.path)
        b.reward[...] = reward
        b.terminated[...] = terminated
        b.truncated[...] = truncated
        done = np.logical_or(b.terminated, b.truncated, out=b.done)
        for src, dst in b.obs_pairs:
            dst[...] = src
        if np.count_nonzero(done):
            self._finish_episodes(b, done, info)
        for flag in b.root_flags:
            flag.fill(False)
        if b.flush_pairs:
            b.flush()

    def contain_faults(self, handler: SubEnvFaultHandler) -> bool:
        """A plain ``SyncVectorEnv``'s sub-envs (what a gymnasium id or an env factory builds with sync vectorisation)
        step one by one here: one that raises is rebuilt alone, from the vector env's own ``env_fns`` (see
        :meth:`EnvBase.contain_faults`). A rebuilt sub-env ``i`` is seeded from the seed of the last full reset
        (``SeedSequence([seed, i, rebuild])``): the same faults at the same steps give the same run."""
        if self._sub_envs is None or self._vec is None:
            return False
        self._rebuilds = SubEnvRebuilds(self, self._vec, self._sub_envs, handler)
        return True

    def _finish_episodes(self, b: Binding, done: np.ndarray, info: dict[str, Any]) -> None:
        """Writes the reset observation of finished sub-envs into root (and the final one into next)."""
        if self._vec is None:
            reset_obs, _ = self._env.reset()
            for leaf, dst in zip(self._leaves, b.root_obs, strict=True):
                dst[...] = pick_leaf(reset_obs, leaf.path)
            return
        rows = np.flatnonzero(done)
        if self._mode == AutoresetMode.SAME_STEP:
            # The step's obs already holds the reset observation of finished sub-envs (copied to root above);
            # their true final observation is only in the info dict.
            final = info["final_obs"]
            for j in rows:
                for leaf, dst in zip(self._leaves, b.next_obs, strict=True):
                    dst[j] = pick_leaf(final[j], leaf.path)
            return
        # NEXT_STEP / DISABLED: the step's obs is the final one; reset just the finished sub-envs now so that
        # no no-op autoreset step ever happens.
        reset_obs, _ = self._vec.reset(options={"reset_mask": done.copy()})
        for leaf, dst in zip(self._leaves, b.root_obs, strict=True):
            dst[rows] = self._every_row(pick_leaf(reset_obs, leaf.path))[rows]

    def _every_row(self, obs: Any) -> np.ndarray:
        """``obs`` of a masked reset, checked to hold every sub-env's row as gymnasium's ``reset_mask`` promises."""
        obs = np.asarray(obs)
        if obs.shape[:1] != (self.num_envs,):
            # A vector env that returns the reset sub-envs only: indexing by sub-env would pick wrong rows.
            raise EnvError(
                f"{type(self._vec).__name__}.reset(options={{'reset_mask': ...}}) returned observations of shape "
                f"{obs.shape}: expected one row for each of its {self.num_envs} sub-envs (the masked-out ones as "
                "they were), as gymnasium's vector envs return"
            )
        return obs

    def _raise_if_outside(self, act: np.ndarray, exc: Exception) -> None:
        """Raises :class:`PolicyError` if ``act`` (``[n_envs, *action_spec.shape]``) is outside the action spec, or
        holds floats where the spec takes integers."""
        spec = self.action_spec
        try:
            value = torch.from_numpy(np.ascontiguousarray(act))
            rows = torch.nonzero(spec.outside(value)).flatten().tolist()
        except Exception:  # an action we cannot even read as the spec's shape: the env's error says more
            return
        if value.is_floating_point() and not spec.dtype.is_floating_point and not self._one_hot:
            # Within range, a float still fails gymnasium's Discrete check (`np.float32(0.59) ... invalid`), which
            # names neither the policy nor the dtype. (A one-hot action was turned into indices before the step.)
            raise PolicyError(
                f"the policy wrote an 'action' of dtype {value.dtype} ({act.flat[0]:g} for sub-env 0): expected "
                f"an integer dtype ({spec.dtype}) for action_spec {spec}. A float action for a discrete space "
                "is usually probabilities or logits: sample an index from them "
                "(torch.distributions.Categorical(logits=...).sample()) or take .argmax(-1); integral floats "
                f"can be cast with .long() ({type(exc).__name__} from the env: {exc})"
            ) from exc
        if rows:
            first = act[rows[0]]
            raise PolicyError(
                f"the policy's action {first.tolist()!r} (sub-env {rows[0]}"
                f"{f' and {len(rows) - 1} more' if len(rows) > 1 else ''}) is outside the action space: expected "
                f"values in action_spec {self.action_spec} ({type(exc).__name__} from the env: {exc})"
            ) from exc

    def _close(self) -> None:
        self._binding, self._rebuilds = None, None
        if self._env is not None:
            self._env.close()

    def __repr__(self) -> str:
        return f"GymEnv(env={self._env!r}, num_envs={self.num_envs}, autoreset_mode={self._mode.name})"


def check_env_id(env_id: str, name: str = "env") -> None:
    """Checks that ``gymnasium.make(env_id)`` will find ``env_id``, without building anything.

    Takes what ``gymnasium.make`` takes: ``"[namespace/]Name[-vN]"``, an unversioned name (the latest
    version is used), or ``"module:id"`` (the module registers the id when imported).

    Args:
        env_id: the gymnasium id.
        name: the argument it was given as (named in the error).

    Raises:
        ConfigurationError: the id is not registered (the message names the closest registered id), or its
            module cannot be imported.

    Examples:
        >>> check_env_id("CartPole-v1")
        >>> check_env_id("CartPol-v1")
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: env='CartPol-v1' is not a registered gymnasium id; did you mean 'CartPole...
    """
    module, env_name = env_id.split(":", 1) if ":" in env_id else (None, env_id)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(
                f"{name}={env_id!r}: module {module!r}, which should register {env_name!r}, cannot be imported ({exc})"
            ) from exc
    registry = gym.envs.registry
    if env_name in registry:
        return
    try:
        namespace, base, version = gym.envs.registration.parse_env_id(env_name)
    except gym.error.Error:
        namespace, base, version = None, None, 0
    latest = gym.envs.registration.find_highest_version(namespace, base) if base is not None else None
    if version is None and latest is not None:
        return  # gymnasium.make picks the latest version
    close = difflib.get_close_matches(env_name, list(registry), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigurationError(
        f"{name}={env_id!r} is not a registered gymnasium id{hint} (register it, or import the package that "
        "registers it, before building the collector; gymnasium.pprint_registry() lists them)"
    )


def _build_vector_env(
    env: str | Callable[[], gym.Env[Any, Any]], n: int, vectorization: str, kwargs: dict[str, Any]
) -> VectorEnv[Any, Any, Any]:
    """Builds our own vector env: SAME_STEP autoreset, no observation copy (we copy it out at once)."""
    if isinstance(env, str):
        check_env_id(env)
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]] = [functools.partial(gym.make, env, **kwargs)] * n
    else:
        if kwargs:
            raise ConfigurationError.bad_value("kwargs", sorted(kwargs), "no gymnasium.make arguments with a callable")
        env_fns = [env] * n
    try:
        if vectorization == "sync":
            return SyncVectorEnv(env_fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
        return AsyncVectorEnv(env_fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
    except (gym.error.Error, TypeError) as exc:
        raise ConfigurationError(f"env={env!r} with kwargs={kwargs!r} could not be built: {exc}") from exc


def _check_resettable(env: VectorEnv[Any, Any, Any], mode: AutoresetMode) -> None:
    base = env.unwrapped
    # GymEnv resets sub-envs with reset_mask at every episode end (in NEXT_STEP mode) and to cut long trajectories:
    # ale-py's AtariVectorEnv raises on it before 0.12 and, in 0.12.0, never returns from it.
    ale = installed_release("ale-py") if type(base).__module__ == "ale_py.vector_env" else None
    if ale is not None and ale < (0, 12, 1):
        raise ConfigurationError.bad_value(
            "env",
            env,
            f"an AtariVectorEnv of ale-py>=0.12.1 (ale-py {'.'.join(map(str, ale))} is installed, whose partial "
            "resets fail or hang; pip install 'acollect[atari]')",
        )
    # An AsyncVectorEnv without shared memory keeps its NEXT_STEP autoreset flag through a masked reset
    # (gymnasium 1.x clears it only on the shared-memory path), so the step after would be a no-op reset.
    if mode == AutoresetMode.NEXT_STEP and isinstance(base, AsyncVectorEnv) and not base.shared_memory:
        raise ConfigurationError.bad_value(
            "env",
            env,
            "an AsyncVectorEnv with shared_memory=True or autoreset_mode=SAME_STEP (with shared_memory=False in "
            "NEXT_STEP mode, gymnasium inserts a no-op step after each partial reset)",
        )
