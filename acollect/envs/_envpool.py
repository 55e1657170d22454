"""Adapter for EnvPool: an ``envpool.make_gymnasium(...)`` env behind the batched env protocol.

EnvPool is optional: this module never imports it. An EnvPool env is recognised by
the classes it is made of (:func:`is_envpool_env`) and driven through its own API:
``step(actions)`` for every sub-env, ``reset(env_ids)`` for some of them.

Autoreset: EnvPool resets a finished sub-env on the step *after* its episode end,
ignoring that step's action and returning the reset observation with a reward of
0 (gymnasium's NEXT_STEP mode, whatever the version says in its metadata). Such a
step never reaches a batch: a finished sub-env is reset at once with
``reset(env_ids)``, which also clears EnvPool's pending autoreset, so the next step
is a real one. The step's observation is the true final one.

Calls: where the env has the bindings envpool 0.9-1.2 is made of (``_send``, ``_recv``, ``_reset`` and the
key lists, see :class:`_Bindings`), the adapter calls them directly, with action arrays built once and the
results picked from EnvPool's flat list of arrays by index: EnvPool's Python ``step`` and ``reset`` around them
build dicts, cast and check arrays and read the whole config on every call, which cost as much as the C++ step of
8 CartPoles (a partial reset through ``reset(env_ids)``: 77 us, 20 us of it in the bindings). An env without
them is driven through ``step`` and ``reset``.

Rows: in EnvPool's synchronous mode (``batch_size == num_envs``, the default) a
call returns its sub-envs in the order their ids were sent, so rows need no
reordering per step; a reset checks the ids it got back, which would also catch
envpool 0.8 under numpy 2 (every row comes back as sub-env 0 there; refused when
the env is wrapped already).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from acollect._validate import check_bool
from acollect.envs._base import DONE_KEYS, EnvBase
from acollect.envs._gym_spaces import observation_layout, pick_leaf, space_to_spec
from acollect.envs._gym_step import Binding, reshape_action
from acollect.envs._versions import installed_release, release
from acollect.errors import ConfigurationError, EnvError
from acollect.specs import OneHot, TensorSpec, Unbounded

__all__ = ["EnvPoolEnv", "is_envpool_env", "reseed_error", "shared_seeds_warning"]

# The mixin of envpool.make_gymnasium envs; make_gym and make_dm envs have others (other step results, gym spaces).
_GYMNASIUM_MIXIN = "GymnasiumEnvPoolMixin"
#: the seed of an EnvPool env built with none given
_DEFAULT_SEED = 42


def is_envpool_env(obj: object) -> bool:
    """Whether ``obj`` is an EnvPool env (of any API flavour), without importing envpool.

    Examples:
        >>> import gymnasium as gym
        >>> vec = gym.make_vec("CartPole-v1", num_envs=2)
        >>> is_envpool_env(vec), is_envpool_env(type(vec))
        (False, False)
        >>> vec.close()
    """
    if isinstance(obj, type):
        return False
    # The classes first: reading an attribute of an arbitrary object may run its code.
    return any(cls.__module__.split(".", 1)[0] == "envpool" for cls in type(obj).__mro__) and hasattr(obj, "config")


class EnvPoolEnv(EnvBase):
    """An EnvPool env, built with ``envpool.make_gymnasium``, as a batched acollect env.

    Collectors wrap an EnvPool env in this class themselves (see :func:`~acollect.envs.make_env`):
    a factory returning ``envpool.make_gymnasium("CartPole-v1", num_envs=8)`` is all they need.
    The adapter owns the env: :meth:`close` closes it.

    Args:
        env: the EnvPool env, in synchronous mode (``batch_size`` left at ``num_envs``) and
            with one player per sub-env.
        categorical_action_encoding: a ``Discrete`` action is an int64 index when True, a
            one-hot vector when False.
        device: where the env's tensors live.
        bindings: call EnvPool's C++ bindings directly where the env has them (see the module's notes);
            False: always through EnvPool's ``step`` and ``reset`` (slower; for an envpool whose internals
            changed in a way the adapter does not notice).

    Raises:
        ConfigurationError: ``env`` is not an EnvPool gymnasium env, runs in asynchronous mode,
            has several players per sub-env, has a space with no spec, or is envpool 0.8 under
            numpy 2 (which hands every sub-env the first one's data).

    Examples:
        >>> import pytest
        >>> envpool = pytest.importorskip("envpool")  # runs where the envpool extra is installed
        >>> env = EnvPoolEnv(envpool.make_gymnasium("CartPole-v1", num_envs=4))
        >>> root = env.reset()
        >>> root["observation"].shape, env.action_spec
        (torch.Size([4, 4]), Categorical(shape=(), dtype=torch.int64, n=2))
        >>> nxt = env.step(root.set("action", env.action_spec.rand((4,))))
        >>> nxt["reward"].shape, nxt["done"].dtype
        (torch.Size([4, 1]), torch.bool)
        >>> env.close()
    """

    action_spec: TensorSpec  # one action: these envs have no keys of their own
    reward_spec: TensorSpec

    def __init__(
        self,
        env: Any,
        *,
        categorical_action_encoding: bool = True,
        device: str | torch.device = "cpu",
        bindings: bool = True,
    ) -> None:
        self._env: Any = None
        self._binding: Binding | None = None
        _check_envpool(env)
        config = env.config
        n = int(config["num_envs"])
        self.device = torch.device(device)
        self.batch_size = torch.Size([n])
        with warnings.catch_warnings():
            # EnvPool builds its float32 Box spaces from float64 bounds, and gymnasium warns that it casts them:
            # what EnvPool means, and nothing a user can change.
            warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
            obs_space, act_space = env.observation_space, env.action_space  # one sub-env's, in EnvPool
        self.observation_spec, self._leaves = observation_layout(obs_space, self.device)
        self.action_spec = space_to_spec(act_space, categorical=categorical_action_encoding, device=self.device)
        if not isinstance(self.action_spec, TensorSpec):
            raise ConfigurationError.bad_value("action_space", act_space, "a single (non Dict/Tuple) space")
        self.reward_spec = Unbounded((1,), dtype=torch.float32, device=self.device)
        self._env = env
        self.build_seed = int(config.get("seed", _DEFAULT_SEED))
        self._one_hot = isinstance(self.action_spec, OneHot)
        self._action_shape = (n, *self.action_spec.shape)
        self._all_ids = np.arange(n, dtype=np.int32)
        self._calls = _Bindings.of(env, self._leaves, n) if check_bool("bindings", bindings) else None

    @property
    def env(self) -> Any:
        """The wrapped EnvPool env."""
        return self._env

    @property
    def uses_bindings(self) -> bool:
        """Whether steps and resets go through EnvPool's C++ bindings directly (else its ``step`` and ``reset``)."""
        return self._calls is not None

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        if seed is not None:
            raise reseed_error(seed, [self.build_seed])
        ids = self._all_ids
        mask_np = self._mask_rows(mask)
        if mask_np is not None:
            if not mask_np.any():
                return
            ids = np.flatnonzero(mask_np).astype(np.int32)
        obs = self._reset(ids)
        rows = torch.from_numpy(ids.astype(np.int64)).to(self.device)
        for leaf, leaf_obs in zip(self._leaves, obs, strict=True):
            target = out.get(leaf.key)
            src = torch.as_tensor(np.asarray(leaf_obs)).to(device=target.device, dtype=target.dtype)
            target[rows] = src.reshape(target[rows].shape)
        for key in DONE_KEYS:
            out.get(key)[rows] = False

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        # The hot path: numpy writes into cached views, no TensorDict access (see gym_step.Binding).
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
        if self._one_hot:
            act = act.argmax(-1)
        calls = self._calls
        if calls is not None:
            np.copyto(calls.action, act, casting="unsafe")  # EnvPool's own step casts the same way
            calls.send(calls.step_args)
            states = calls.recv()
            for index, dst in zip(calls.obs, b.next_obs, strict=True):
                dst[...] = states[index]
            b.reward[...] = states[calls.reward]
            b.truncated[...] = states[calls.trunc]
            # EnvPool's "done" holds truncations too: terminated is done and not truncated, as its step says.
            np.greater(states[calls.done], b.truncated, out=b.terminated)
        else:
            obs, reward, terminated, truncated, _ = self._env.step(act)
            if b.flat:
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
            # Reset the finished sub-envs now: left to EnvPool, their next step would be a no-op reset.
            ids = np.flatnonzero(done).astype(np.int32)
            for leaf_obs, dst in zip(self._reset(ids), b.root_obs, strict=True):
                dst[ids] = leaf_obs
        for flag in b.root_flags:
            flag.fill(False)
        if b.flush_pairs:
            b.flush()

    def _reset(self, ids: np.ndarray) -> list[Any]:
        """Resets the sub-envs ``ids`` (int32, ascending); returns their observations, one array per leaf (in the
        order of ``self._leaves``), one row per id, in order."""
        calls = self._calls
        if calls is not None:
            calls.reset(ids)
            states = calls.recv()
            got = states[calls.env_id]
            obs = [states[index] for index in calls.obs]
        else:
            raw, info = self._env.reset(ids)
            got = np.asarray(info["env_id"])
            obs = [pick_leaf(raw, leaf.path) for leaf in self._leaves]
        # Bytes: a tenth of np.array_equal's cost, and both are int32 (EnvPool's env ids, and ids as built here).
        if got.dtype != ids.dtype or got.tobytes() != ids.tobytes():
            raise EnvError(
                f"EnvPool answered a reset of sub-envs {ids.tolist()} with sub-envs {got.tolist()}: expected the "
                f"same ids in the same order (numpy {np.__version__} here; envpool 0.8 needs numpy<2)"
            )
        return obs

    def _close(self) -> None:
        self._binding = None
        if self._env is not None:
            self._env.close()
            self._env = None  # EnvPool's threads stop when the env is collected

    def __repr__(self) -> str:
        return f"EnvPoolEnv(env={type(self._env).__name__}, num_envs={self.num_envs})"


class _Bindings:
    """EnvPool's own C++ calls for one env, and where its results sit in the flat list they come back as.

    ``send(step_args)`` steps every sub-env with :attr:`action` (written in place before each step: EnvPool has
    read it by the time ``recv`` returns, in synchronous mode); ``reset(ids)`` resets some; ``recv()`` returns a
    list of arrays, one per name in the env's ``_state_keys`` (``"obs"`` or ``"obs:key"`` per observation leaf,
    ``"reward"``, ``"done"`` (truncations included), ``"trunc"``, ``"info:env_id"``, ...).
    """

    __slots__ = ("action", "done", "env_id", "obs", "recv", "reset", "reward", "send", "step_args", "trunc")

    def __init__(self, env: Any, state_keys: list[str], obs: list[int], action: np.ndarray, n: int) -> None:
        self.send, self.recv, self.reset = env._send, env._recv, env._reset
        self.obs = obs
        self.reward, self.done = state_keys.index("reward"), state_keys.index("done")
        self.trunc, self.env_id = state_keys.index("trunc"), state_keys.index("info:env_id")
        self.action = action
        ids = np.arange(n, dtype=np.int32)
        # In the order of the env's _action_keys: env_id, players.env_id (one player per sub-env), the action.
        self.step_args = [ids, ids.copy(), action]

    @classmethod
    def of(cls, env: Any, leaves: Sequence[Any], n: int) -> _Bindings | None:
        """The bindings of ``env``, or ``None`` where it lacks any of them (then the adapter calls ``step`` and
        ``reset``): an envpool whose internals differ from 0.9-1.2's is driven through its public API."""
        try:
            state_keys = list(env._state_keys)
            action_keys = list(env._action_keys)
            action_spec = env._spec._action_spec[-1]  # (dtype, shape with -1 for the sub-env dim, ...)
            send, recv, reset = env._send, env._recv, env._reset
        except AttributeError:
            return None
        if not all(callable(call) for call in (send, recv, reset)):
            return None
        if action_keys[:2] != ["env_id", "players.env_id"] or len(action_keys) != 3:
            return None  # a dict action, or a layout this adapter does not know
        if not {"reward", "done", "trunc", "info:env_id"} <= set(state_keys):
            return None
        obs_keys = [k for k in state_keys if k == "obs" or k.startswith("obs:")]
        obs: list[int] = []
        for leaf in leaves:
            # EnvPool names a Dict observation's leaves "obs:key:subkey"; a single leaf is its only "obs..." key.
            key = "obs:" + ":".join(map(str, leaf.path)) if leaf.path else (obs_keys[0] if len(obs_keys) == 1 else "")
            if key not in state_keys:
                return None
            obs.append(state_keys.index(key))
        dtype, shape = np.dtype(action_spec[0]), tuple(action_spec[1])
        if not shape or shape[0] != -1:
            return None
        action = np.zeros((n, *shape[1:]), dtype=dtype)
        bindings = cls(env, state_keys, obs, action, n)
        check = getattr(env, "_check_action", None)
        if check is not None:  # what EnvPool's own send checks once: dtypes and shapes
            check(bindings.step_args)
        return bindings


def reseed_error(seed: int, build_seeds: Sequence[int | None]) -> ConfigurationError:
    """The error for seeding EnvPool envs after they were built (a reset's ``seed``, a collector's ``set_seed``).

    Args:
        seed: the seed asked for.
        build_seeds: the seeds the envs were built with: the env's, or one per worker (``None``: not EnvPool).

    Examples:
        >>> str(reseed_error(1, [0])).split(": ")[:2]
        ['seed=1 is invalid', 'expected no seed after the env is built']
    """
    if len(build_seeds) == 1:
        seeds, per_worker = f"this one with seed={build_seeds[0]}", ""
    else:
        seeds = ", ".join(f"worker {w}'s with seed={s}" for w, s in enumerate(build_seeds) if s is not None)
        per_worker = ", one for each worker, spaced by num_envs,"
    return ConfigurationError.bad_value(
        "seed",
        seed,
        f"no seed after the env is built: EnvPool seeds its sub-envs once, when it is built ({seeds}; "
        f"sub-env i with seed + i); pass seed= to envpool.make_gymnasium(...) in the env factory{per_worker} instead "
        "of seeding the collector",
    )


def shared_seeds_warning(workers: Sequence[tuple[int | None, int]]) -> str | None:
    """What to warn where the EnvPool envs of several workers share seeds; ``None`` where none do.

    Two such workers step the same episodes (and, given the same actions, collect the same data), and no
    ``set_seed`` can move them apart: EnvPool seeds its sub-envs once, when built.

    Args:
        workers: each worker's ``(build_seed, n_envs)``; ``build_seed`` ``None``: not an EnvPool env.

    Examples:
        >>> shared_seeds_warning([(0, 4), (4, 4)]) is None
        True
        >>> shared_seeds_warning([(42, 4), (42, 4), (8, 4)]).split(" (")[0]
        'workers 0 and 1 step EnvPool envs whose seeds overlap'
    """
    seeded = [(w, seed, n) for w, (seed, n) in enumerate(workers) if seed is not None]
    clash = sorted(
        {w for (w, s, n), (v, t, m) in itertools.combinations(seeded, 2) if s < t + m and t < s + n for w in (w, v)}
    )
    if not clash:
        return None
    sizes = {n for w, _, n in seeded if w in clash}
    each = (
        f"{sizes.pop()} sub-envs each"
        if len(sizes) == 1
        else "sub-envs " + ", ".join(f"{n} for worker {w}" for w, _, n in seeded if w in clash)
    )
    seeds = ", ".join(f"worker {w} seed={s}" for w, s, _ in seeded if w in clash)
    default = f"; {_DEFAULT_SEED} is EnvPool's default" if any(s == _DEFAULT_SEED for _, s, _ in seeded) else ""
    n_envs = max(n for _, _, n in seeded)
    names = ", ".join(map(str, clash[:-1])) + f" and {clash[-1]}"
    return (
        f"workers {names} step EnvPool envs whose seeds overlap ({seeds}, {each}{default}): EnvPool seeds sub-env i "
        "with seed + i once, when it is built, so their sub-envs of the same seed start the same episodes, and "
        "set_seed() cannot move them apart. Give each worker's env factory a seed of its own, spaced by num_envs, e.g. "
        f"[functools.partial(envpool.make_gymnasium, task_id, num_envs={n_envs}, seed={n_envs} * i) "
        f"for i in range({len(workers)})]."
    )


def _check_envpool(env: Any) -> None:
    """Raises :class:`ConfigurationError` unless ``env`` is an EnvPool env this adapter can drive."""
    if not is_envpool_env(env):
        raise ConfigurationError.bad_value("env", env, "an EnvPool env (envpool.make_gymnasium(...))")
    if not any(cls.__name__ == _GYMNASIUM_MIXIN for cls in type(env).__mro__):
        raise ConfigurationError.bad_value(
            "env", env, "an EnvPool env with the gymnasium API, built by envpool.make_gymnasium(...)"
        )
    config = env.config
    n = int(config["num_envs"])
    if config.get("batch_size", 0) not in (0, n):
        raise ConfigurationError.bad_value(
            "env.config['batch_size']",
            config["batch_size"],
            f"{n} (num_envs, the default): a collector steps every sub-env at each step, and in asynchronous "
            "mode EnvPool hands back only the first batch_size of them",
        )
    if config.get("max_num_players", 1) != 1:
        raise ConfigurationError.bad_value("env.config['max_num_players']", config["max_num_players"], "1")
    version = installed_release("envpool")
    if version is not None and version < (0, 9) and release(np.__version__) >= (2,):
        raise ConfigurationError(
            f"envpool {'.'.join(map(str, version))} does not work with numpy {np.__version__}: it hands every "
            "sub-env the data of the first one. Install numpy<2, or envpool>=0.9 (pip install 'acollect[envpool]')."
        )
