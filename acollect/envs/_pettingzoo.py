"""PettingZoo adapter: ``num_envs`` copies of a parallel multi-agent env behind the batched env protocol.

:class:`PettingZooEnv` builds ``num_envs`` copies of a PettingZoo ``ParallelEnv``, steps them in
lockstep and stacks their agents by group: agents named ``<prefix>_<int>`` share the group
``<prefix>`` (``red_0`` and ``red_1`` go to ``"red"``), any other agent is a group of its own, as
TorchRL's ``PettingZooWrapper`` groups a parallel env. A group ``g`` of ``n`` agents reads
``(g, "action")`` and writes ``(g, "observation")``, ``(g, "reward")``, ``(g, "mask")`` and its own
``done``/``terminated``/``truncated`` flags, each with a leading dim of ``n``.

Agents that leave: a PettingZoo episode goes on while any agent is left (``env.agents`` shrinks as
agents finish), so the copy ends (root ``done``) when every agent is done, and resets then. An agent
that left is masked (``(g, "mask")`` False), its observation and reward are zero, its flags stay what
they were when it left, and no action goes to the env for it (a parallel env takes actions for live
agents only). ``done_on_any=True`` ends the copy as soon as one agent is done instead, TorchRL's
default for parallel envs.

Faults: with ``env_errors="restart"`` the engine has the env contain a copy's exception
(:meth:`PettingZooEnv.contain_faults`): the copy that raised is rebuilt alone from ``env_fn()``
(:mod:`acollect.envs._pettingzoo_faults`), the other copies stepping on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from acollect.envs._base import DONE_KEYS, EnvBase, SubEnvFaultHandler
from acollect.envs._gym_spaces import ObsLeaf, _leaves, pick_leaf, space_to_spec
from acollect.envs._pettingzoo_faults import CopyRebuilds, raise_if_outside
from acollect.errors import ConfigurationError, EnvError, PolicyError
from acollect.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)

__all__ = ["PettingZooEnv", "default_group_map"]

# Keys the collector writes at the root of a TensorDict: a group may not take one as its name.
_RESERVED = frozenset({"action", "reward", "next", "collector", *DONE_KEYS})
_SUFFIX = re.compile(r"^(?P<prefix>.+)_\d+$")


def default_group_map(agents: Sequence[str]) -> dict[str, list[str]]:
    """Groups agents by name as TorchRL's ``PettingZooWrapper`` does for a parallel env.

    ``<prefix>_<int>`` goes to group ``<prefix>``; a name without an integer suffix is a group of its own.

    Examples:
        >>> default_group_map(["red_0", "red_1", "blue_0", "referee", "team_a_2"])
        {'red': ['red_0', 'red_1'], 'blue': ['blue_0'], 'referee': ['referee'], 'team_a': ['team_a_2']}
    """
    groups: dict[str, list[str]] = {}
    for agent in agents:
        match = _SUFFIX.match(agent)
        groups.setdefault(match["prefix"] if match else agent, []).append(agent)
    return groups


def _stacked(spec: TensorSpec | Composite, n: int) -> Any:
    """``spec`` with a leading dim of ``n``: one entry per agent of a group."""
    if isinstance(spec, Composite):
        return Composite({k: _stacked(v, n) for k, v in spec.items()})
    shape = (n, *spec.shape)
    if isinstance(spec, Bounded):
        return Bounded(spec.low.expand(shape), spec.high.expand(shape), shape, spec.dtype, spec.device)
    if isinstance(spec, Categorical):
        return Categorical(spec.n, shape, spec.dtype, spec.device, start=spec.start)
    if isinstance(spec, OneHot):
        return OneHot(spec.n, spec.dtype, spec.device, shape=shape)
    if isinstance(spec, MultiCategorical):
        return MultiCategorical(spec.nvec.expand(shape), spec.dtype, spec.device, start=spec.start.expand(shape))
    if isinstance(spec, Binary):
        return Binary(shape, spec.dtype, spec.device)
    return Unbounded(shape, spec.dtype, spec.device)


def _flag(n: int, device: torch.device) -> Binary:
    return Binary((n, 1), dtype=torch.bool, device=device)


@dataclass
class _Group:
    """One group of agents: its name, agents, spaces and where each observation leaf goes."""

    name: str
    agents: list[str]
    action_space: spaces.Space[Any]
    action_spec: TensorSpec | None = None  # stacked: [n_agents, *shape]
    # Keys relative to the group: ("observation",), ("observation", "pos"), or ("action_mask",) for a Dict
    # observation's action mask, which TorchRL also keeps beside the observation.
    obs_leaves: list[ObsLeaf] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.agents)


class PettingZooEnv(EnvBase):
    """``num_envs`` copies of a PettingZoo parallel env, stepped in lockstep as one batched env.

    Args:
        env_fn: a zero-argument callable returning a ``pettingzoo.ParallelEnv`` (called once per copy).
        num_envs: copies to build; the env's batch size is ``[num_envs]``.
        group_map: ``{group: [agent names]}`` covering every agent once; ``None`` groups by name prefix
            (:func:`default_group_map`). Agents of one group must share their observation and action spaces.
        categorical_actions: a ``Discrete`` action is an int64 index (:class:`~acollect.specs.Categorical`)
            when True, a one-hot vector (:class:`~acollect.specs.OneHot`) when False.
        device: where the env's tensors live.
        done_on_any: end a copy's episode as soon as one agent is done (TorchRL's default for parallel envs);
            False (the default) ends it when every agent is, as PettingZoo does.

    Raises:
        ConfigurationError: ``env_fn`` does not return a parallel env (an AEC env included), a group whose agents
            have different spaces, a Dict or Tuple action space, or a ``group_map`` that does not fit the agents.

    Examples:
        >>> import pytest
        >>> simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")  # the pettingzoo extra
        >>> import functools
        >>> env = PettingZooEnv(functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=2), num_envs=2)
        >>> env.group_map
        {'agent': ['agent_0', 'agent_1', 'agent_2']}
        >>> root = env.reset(seed=0)
        >>> root["agent", "observation"].shape, env.action_keys
        (torch.Size([2, 3, 18]), [('agent', 'action')])
        >>> nxt = env.step(env.action_spec.rand((2,)))
        >>> nxt["agent", "reward"].shape, nxt["done"].tolist()
        (torch.Size([2, 3, 1]), [[False], [False]])
        >>> env.step(env.action_spec.rand((2,)))["truncated"].tolist()  # max_cycles=2: both copies end, and reset
        [[True], [True]]
        >>> env.close()
    """

    def __init__(
        self,
        env_fn: Callable[[], Any],
        num_envs: int = 1,
        group_map: Mapping[str, Sequence[str]] | None = None,
        *,
        categorical_actions: bool = True,
        device: str | torch.device = "cpu",
        done_on_any: bool = False,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigurationError.bad_value("num_envs", num_envs, "a positive int")
        if not callable(env_fn):
            raise ConfigurationError.bad_value(
                "env_fn",
                env_fn,
                "a zero-argument callable returning a PettingZoo ParallelEnv (e.g. "
                "functools.partial(simple_spread_v3.parallel_env, N=3)), called once per copy; not an env instance",
            )
        self.device = torch.device(device)
        self.batch_size = torch.Size([num_envs])
        self._env_fn = env_fn  # kept: a copy that raised is rebuilt from it (contain_faults)
        self._rebuilds: CopyRebuilds | None = None  # set by contain_faults()
        self._done_on_any = bool(done_on_any)
        self._envs: list[Any] = []
        try:
            for _ in range(num_envs):
                self._envs.append(_checked_parallel_env(env_fn(), env_fn))
            self._groups = _make_groups(self._envs[0], group_map)
            for other in self._envs[1:]:
                if list(other.possible_agents) != list(self._envs[0].possible_agents):
                    raise ConfigurationError.bad_value(
                        "env_fn", env_fn, "copies with the same possible_agents (each call returned different ones)"
                    )
            self._build_specs(categorical_actions)
        except BaseException:
            for env in self._envs:
                env.close()
            self._envs = []
            self._closed_unbuilt()
            raise
        # Where each agent sits: its group and its row in the group's tensors.
        self._where = {agent: (g, j) for g in self._groups for j, agent in enumerate(g.agents)}
        # What each agent's flags were when it left, per copy: kept until the copy resets.
        self._left: list[dict[str, tuple[bool, bool]]] = [{} for _ in range(num_envs)]
        # Every row is built on the CPU (numpy views of these tensors), then copied out once per key.
        self._stage = self._make_stage()
        self._np = {key: self._stage.get(key).numpy() for key in self._stage.keys(True, True)}

    # -- specs --------------------------------------------------------------------
    def _build_specs(self, categorical_actions: bool) -> None:
        env, dev = self._envs[0], self.device
        obs, act, rew, done = Composite(), Composite(), Composite(), Composite()
        for g in self._groups:
            space = env.observation_space(g.agents[0])
            g.obs_leaves = _obs_leaves(space)
            agent_obs = space_to_spec(space, device=dev, double_to_float=True)
            group_obs = Composite()
            action_mask = None
            if isinstance(space, spaces.Dict) and "action_mask" in agent_obs:
                action_mask = Binary((g.size, *agent_obs["action_mask"].shape), dtype=torch.bool, device=dev)
                agent_obs = Composite({k: v for k, v in agent_obs.items() if k != "action_mask"})
            if not isinstance(agent_obs, Composite) or len(agent_obs):
                group_obs["observation"] = _stacked(agent_obs, g.size)
            if action_mask is not None:
                group_obs["action_mask"] = action_mask
            group_obs["mask"] = Binary((g.size,), dtype=torch.bool, device=dev)
            obs[g.name] = group_obs
            agent_act = space_to_spec(g.action_space, categorical=categorical_actions, device=dev, double_to_float=True)
            g.action_spec = _stacked(agent_act, g.size)
            act[g.name] = Composite(action=g.action_spec)
            rew[g.name] = Composite(reward=Unbounded((g.size, 1), dtype=torch.float32, device=dev))
            done[g.name] = Composite({key: _flag(g.size, dev) for key in DONE_KEYS})
        self.observation_spec, self.action_spec, self.reward_spec, self.done_spec = obs, act, rew, done

    def _make_stage(self) -> TensorDict:
        """What :meth:`make_next` builds, on the CPU: rows are written through numpy views of it."""
        stage = self.observation_spec.to("cpu").zero(self.batch_size)
        for key in DONE_KEYS:
            stage.set(key, torch.zeros((*self.batch_size, 1), dtype=torch.bool))
        for spec in (self.done_spec, self.reward_spec):
            assert isinstance(spec, Composite)  # both built by _build_specs
            for leaf_key, leaf in spec.to("cpu").leaf_items():
                stage.set(leaf_key, leaf.zero(self.batch_size))
        return stage

    # -- properties ---------------------------------------------------------------
    @property
    def group_map(self) -> dict[str, list[str]]:
        """``{group: [agent names]}``: the row of each agent in its group's tensors."""
        return {g.name: list(g.agents) for g in self._groups}

    @property
    def envs(self) -> list[Any]:
        """The PettingZoo parallel envs, one per copy."""
        return list(self._envs)

    # -- protocol ------------------------------------------------------------------
    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        n = self.num_envs
        picked = self._mask_rows(mask)
        rows = list(range(n)) if picked is None else np.flatnonzero(picked).tolist()
        if not rows:
            return
        if seed is not None and len(rows) == n and self._rebuilds is not None:
            self._rebuilds.reseed(seed)
        for i in rows:
            self._reset_row(i, None if seed is None else seed + i)
        self._write(out, rows, with_reward=False)

    def step_and_reset_into(self, action: Any, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._check_open()
        acts = {g.name: self._group_action(action, g) for g in self._groups}
        rebuilds = self._rebuilds
        finished: list[int] = []
        for i in range(self.num_envs):
            try:
                if self._step_row(i, acts):
                    finished.append(i)
            except Exception as exc:  # noqa: PERF203 - free until it raises (zero-cost try), and each copy has its own
                if rebuilds is None:
                    raise
                rebuilds.raised(i, exc, acts, finished, ended=False)
        self._write(next_out, None, with_reward=True)
        for i in finished:
            try:
                self._reset_row(i, None)  # the copy's RNG goes on: only the first reset takes a seed
            except Exception as exc:  # noqa: PERF203 - as above
                if rebuilds is None:
                    raise
                rebuilds.raised(i, exc, acts, finished, ended=True)
        for key in DONE_KEYS:
            self._np[key].fill(False)  # a copy that did not finish has no root flag set
        self._write(root_out, None, with_reward=False)

    def contain_faults(self, handler: SubEnvFaultHandler) -> bool:
        """A copy that raises in its ``step`` (or in the reset after its episode ended) is rebuilt alone from
        ``env_fn()``, the others stepping on (:meth:`EnvBase.contain_faults`), seeded ``SeedSequence([seed, i,
        rebuild])`` from the last seeded full reset. An action outside its space is the policy's fault: raised."""
        self._rebuilds = CopyRebuilds(self, self._new_copy, handler)
        return True

    def _new_copy(self) -> Any:
        """A copy built by ``env_fn()`` in place of one that raised, checked as the first copies were."""
        env = _checked_parallel_env(self._env_fn(), self._env_fn)
        if sorted(env.possible_agents) != sorted(self._where):  # its agents must fit the groups the specs were made of
            env.close()
            raise EnvError(f"env_fn() built a copy of agents {env.possible_agents}: the first had {list(self._where)}")
        return env

    def _group_action(self, action: Any, g: _Group) -> np.ndarray:
        value = action.get((g.name, "action"), None) if isinstance(action, TensorDictBase) else None
        spec = g.action_spec
        assert spec is not None  # set by _build_specs
        want = (self.num_envs, *spec.shape)
        if not isinstance(value, torch.Tensor) or value.numel() != int(np.prod(want)):
            got = None if value is None else tuple(getattr(value, "shape", ()))
            raise PolicyError(
                f"{type(self).__name__} steps with a TensorDict [{self.num_envs}] holding ({g.name!r}, 'action') of "
                f"shape {want} (action_spec {spec}); got {got if got is not None else 'none'}"
            )
        arr = value.detach().cpu().reshape(want).numpy()
        return arr.argmax(-1) if isinstance(spec, OneHot) else arr

    # -- rows ------------------------------------------------------------------------
    def _step_row(self, i: int, acts: dict[str, np.ndarray]) -> bool:
        """Steps copy ``i`` with its agents' rows of ``acts`` into the stage; returns whether its episode ended.

        Raises:
            PolicyError: the copy raised, and an action it was given is outside its agent's action space.
        """
        env = self._envs[i]
        step_actions = {}
        for agent in env.agents:  # live agents only: a parallel env takes no action for one that left
            g, j = self._where[agent]
            step_actions[agent] = _to_space(acts[g.name][i, j], g.action_space)
        try:
            obs, rewards, terms, truncs, _ = env.step(step_actions)
        except Exception as exc:
            raise_if_outside(i, step_actions, {a: g.action_space for a, (g, _) in self._where.items()}, exc)
            raise
        return self._fill_step(i, obs, rewards, terms, truncs, env.agents)

    def _reset_row(self, i: int, seed: int | None) -> None:
        env = self._envs[i]
        obs, _ = env.reset(seed=seed)
        self._left[i].clear()
        live = set(env.agents)
        for g in self._groups:
            for j, agent in enumerate(g.agents):
                self._write_obs(g, i, j, obs.get(agent))
                self._np[(g.name, "mask")][i, j] = agent in live
            for key in DONE_KEYS:
                self._np[(g.name, key)][i] = False
        for key in DONE_KEYS:
            self._np[key][i] = False

    def _fill_step(
        self,
        i: int,
        obs: dict[str, Any],
        rewards: dict[str, Any],
        terms: dict[str, Any],
        truncs: dict[str, Any],
        agents: Sequence[str],
    ) -> bool:
        """Writes copy ``i``'s step into the stage; returns whether its episode ended."""
        left, live = self._left[i], set(agents)
        every_done, every_term, any_done, any_term, any_trunc = True, True, False, False, False
        for g in self._groups:
            reward, mask = self._np[(g.name, "reward")], self._np[(g.name, "mask")]
            term_a, trunc_a, done_a = (self._np[(g.name, key)] for key in ("terminated", "truncated", "done"))
            for j, agent in enumerate(g.agents):
                self._write_obs(g, i, j, obs.get(agent))
                reward[i, j, 0] = rewards.get(agent, 0.0)
                if agent in terms or agent in truncs:
                    term, trunc = bool(terms.get(agent, False)), bool(truncs.get(agent, False))
                    if term or trunc:
                        left[agent] = (term, trunc)
                elif agent in left:
                    term, trunc = left[agent]
                else:  # not in the env, and never seen leaving: it is not coming back this episode
                    term, trunc = agent not in live, False
                term_a[i, j, 0], trunc_a[i, j, 0], done_a[i, j, 0] = term, trunc, term or trunc
                mask[i, j] = agent in live and not (term or trunc)
                every_done &= term or trunc
                every_term &= term
                any_done |= term or trunc
                any_term |= term
                any_trunc |= trunc
        if self._done_on_any:
            done = any_done or not live
            terminated, truncated = any_term or (done and not any_trunc), any_trunc
        else:
            done = every_done or not live
            terminated = done and every_term
            truncated = done and not terminated
        self._np["done"][i], self._np["terminated"][i], self._np["truncated"][i] = done, terminated, truncated
        return done

    def _write_obs(self, g: _Group, i: int, j: int, agent_obs: Any) -> None:
        for leaf in g.obs_leaves:
            key = (g.name, *leaf.key)
            target = self._np[key]
            target[i, j] = 0 if agent_obs is None else pick_leaf(agent_obs, leaf.path)

    def _write(self, out: TensorDictBase, rows: list[int] | None, *, with_reward: bool) -> None:
        index = None if rows is None else torch.tensor(rows)
        for key, src in self._stage.items(True, True):
            if key[-1] == "reward" and not with_reward:
                continue
            dst = out.get(key)
            if index is None:
                dst.copy_(src)
            else:
                dst[index.to(dst.device)] = src[index].to(dst.device)

    def _close(self) -> None:
        errors = []
        for env in self._envs:
            try:
                env.close()
            except Exception as exc:  # noqa: PERF203 - every copy is closed, whatever the others raise
                errors.append(exc)
        self._envs, self._rebuilds = [], None
        if errors:
            raise errors[0]

    def __repr__(self) -> str:
        return f"PettingZooEnv(num_envs={self.num_envs}, group_map={self.group_map})"


def _checked_parallel_env(env: Any, env_fn: Any) -> Any:
    from pettingzoo import AECEnv, ParallelEnv

    if isinstance(env, ParallelEnv):
        return env
    if hasattr(env, "close"):
        env.close()
    if isinstance(env, AECEnv):
        raise ConfigurationError.bad_value(
            "env_fn",
            env_fn,
            "a callable returning a PettingZoo ParallelEnv, not an AEC env: use the env's parallel_env() "
            "(simple_spread_v3.parallel_env), or wrap it: pettingzoo.utils.conversions.aec_to_parallel(env)",
        )
    raise ConfigurationError.bad_value(
        "env_fn", env_fn, f"a callable returning a PettingZoo ParallelEnv (it returned a {type(env).__name__})"
    )


def _make_groups(env: Any, group_map: Mapping[str, Sequence[str]] | None) -> list[_Group]:
    agents = list(env.possible_agents)
    if group_map is None:
        group_map = default_group_map(agents)
    expected = f"a dict of group name -> agent names, naming each of {agents} once"
    if not isinstance(group_map, Mapping) or any(isinstance(v, str) for v in group_map.values()):
        raise ConfigurationError.bad_value("group_map", group_map, expected)
    named = [a for members in group_map.values() for a in members]
    if sorted(named) != sorted(agents) or any(not members for members in group_map.values()):
        raise ConfigurationError.bad_value("group_map", group_map, expected)
    clash = sorted(str(g) for g in group_map if g in _RESERVED or not isinstance(g, str))
    if clash:
        raise ConfigurationError.bad_value(
            "group_map", group_map, f"group names that are strings and not among {sorted(_RESERVED)} (not {clash})"
        )
    groups = []
    for name, members in group_map.items():
        first = members[0]
        for kind in ("observation", "action"):
            space_of = getattr(env, f"{kind}_space")
            odd = [a for a in members if space_of(a) != space_of(first)]
            if odd:
                split = {name: [a for a in members if a not in odd], f"{name}_other": odd}
                raise ConfigurationError.bad_value(
                    "group_map",
                    dict(group_map),
                    f"groups whose agents share their {kind} space: in group {name!r}, {odd[0]!r} has "
                    f"{space_of(odd[0])} but {first!r} has {space_of(first)}; pass a group_map putting them in "
                    f"separate groups, e.g. {split}",
                )
        action_space = env.action_space(first)
        if isinstance(action_space, (spaces.Dict, spaces.Tuple)):
            raise ConfigurationError.bad_value(
                "action_space",
                action_space,
                f"a Box, Discrete, MultiDiscrete or MultiBinary action space for group {name!r}, whose actions "
                "stack into one tensor; wrap the env so that it takes a flat action",
            )
        groups.append(_Group(str(name), list(members), action_space))
    return groups


def _obs_leaves(space: spaces.Space[Any]) -> list[ObsLeaf]:
    """Each observation leaf of one agent, keyed under ``"observation"`` (a Dict's ``"action_mask"`` beside it)."""
    leaves = _leaves(space, ("observation",), ())
    return [ObsLeaf(("action_mask",), leaf.path) if leaf.path == ("action_mask",) else leaf for leaf in leaves]


def _to_space(value: np.ndarray, space: spaces.Space[Any]) -> Any:
    """One agent's action as its space takes it: a Python int for ``Discrete``, an array of its dtype otherwise."""
    if isinstance(space, spaces.Discrete):
        return int(value)
    return np.asarray(value, dtype=space.dtype)
