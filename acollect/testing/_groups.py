"""A deterministic multi-agent env, and the check that every frame of a batch collected from it is real.

:class:`GroupCountingEnv` has groups of agents under nested keys, as TorchRL's multi-agent envs do: agent ``j`` of
group ``g`` observes ``(g, "observation")[j] = [counter, its previous action, j]``, acts through ``(g, "action")[j]``
and is rewarded ``(g, "reward")[j] = 10 * action + j``. The counter follows :class:`~acollect.testing.CountingEnv`'s
scheme (+1 a step, +``RESET_JUMP`` a reset, sub-env ``i`` from ``i * ENV_STRIDE``), so
:func:`assert_group_counting_batch` can tell, for every frame and every agent, that the transition happened, that
nothing was lost or repeated, that the action stored is the one the env was stepped with (the next observation
echoes it) and that the reward is the one that action earned.

Examples:
    >>> import torch
    >>> env = GroupCountingEnv(num_envs=2, groups={"red": 2, "blue": 1}, episode_length=2)
    >>> root = env.reset()
    >>> root["red", "observation"][0].tolist()
    [[0.0, -1.0, 0.0], [0.0, -1.0, 1.0]]
    >>> action = env.action_spec.zero((2,))
    >>> action["red", "action"] = torch.tensor([[1, 2], [0, 0]])
    >>> out = env.step(root.update(action))
    >>> out["red", "observation"][0].tolist(), out["red", "reward"][0].squeeze(-1).tolist()
    ([[1.0, 1.0, 0.0], [1.0, 2.0, 1.0]], [10.0, 21.0])
    >>> env.done_keys[3:]
    [('red', 'done'), ('red', 'terminated'), ('red', 'truncated'), ('blue', 'done'), ('blue', 'terminated'), ('blue', 'truncated')]
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect.envs import DONE_KEYS, EnvBase
from acollect.errors import ConfigurationError
from acollect.specs import Categorical, Composite, Unbounded
from acollect.testing._envs import ENV_STRIDE, RESET_JUMP, positive_int

__all__ = ["GroupCountingEnv", "assert_group_counting_batch"]

#: The groups of :class:`GroupCountingEnv` unless told: two agents in one, one in the other.
DEFAULT_GROUPS: Mapping[str, int] = {"red": 2, "blue": 1}
#: The reward of an action ``a`` of agent ``j``: ``REWARD_SCALE * a + j``.
REWARD_SCALE = 10.0


class GroupCountingEnv(EnvBase):
    """A batched env of groups of agents whose observations count steps and echo each agent's last action.

    Every agent of every sub-env ends its episode together, ``terminated``, after ``episode_length`` steps (one int
    or one per sub-env); the root flags and each group's flags (``[n_agents, 1]``) say so alike. Seeds are accepted
    and ignored: the env is deterministic.

    Args:
        num_envs: number of sub-envs.
        groups: agents per group name.
        episode_length: steps per episode, one int for all sub-envs or one per sub-env.
        n_actions: each agent's discrete actions (``Categorical``).

    Attributes:
        groups: agents per group name.
        counter: int64 ``[num_envs]``, each sub-env's current counter.
    """

    def __init__(
        self,
        num_envs: int = 1,
        groups: Mapping[str, int] | None = None,
        episode_length: int | Sequence[int] = 5,
        *,
        n_actions: int = 3,
    ) -> None:
        n = positive_int("num_envs", num_envs)
        self.groups = dict(DEFAULT_GROUPS if groups is None else groups)
        if not self.groups or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in self.groups.values()
        ):
            raise ConfigurationError.bad_value("groups", groups, "a mapping of group names to agent counts >= 1")
        lengths = [episode_length] * n if isinstance(episode_length, int) else list(episode_length)
        if len(lengths) != n or not all(isinstance(x, int) and x >= 1 for x in lengths):
            raise ConfigurationError.bad_value(
                "episode_length", episode_length, f"a positive int or {n} positive ints (one per sub-env)"
            )
        self.batch_size = torch.Size([n])
        actions = positive_int("n_actions", n_actions)
        self.observation_spec = Composite({g: Composite(observation=Unbounded((k, 3))) for g, k in self.groups.items()})
        self.action_spec = Composite({g: Composite(action=Categorical(actions, (k,))) for g, k in self.groups.items()})
        self.reward_spec = Composite({g: Composite(reward=Unbounded((k, 1))) for g, k in self.groups.items()})
        flag = {g: Unbounded((k, 1), dtype=torch.bool) for g, k in self.groups.items()}
        self.done_spec = Composite({g: Composite(dict.fromkeys(DONE_KEYS, flag[g])) for g in self.groups})
        self.episode_length = torch.tensor(lengths, dtype=torch.int64)
        self.counter = torch.arange(n, dtype=torch.int64) * ENV_STRIDE - RESET_JUMP  # the first reset lands on i*STRIDE
        self._in_episode = torch.zeros(n, dtype=torch.int64)

    def _write_obs(self, out: TensorDictBase, rows: Any, previous: dict[str, torch.Tensor] | None) -> None:
        for group, k in self.groups.items():
            obs = out.get((group, "observation"))
            obs[rows, :, 0] = self.counter[rows].unsqueeze(-1).to(obs.dtype)
            obs[rows, :, 1] = -1.0 if previous is None else previous[group][rows].to(obs.dtype)
            obs[rows, :, 2] = torch.arange(k, dtype=obs.dtype)

    def _write_flags(self, out: TensorDictBase, rows: Any, ended: torch.Tensor | None) -> None:
        for key in self.done_keys:
            flag = out.get(key)
            if ended is None or key[-1] == "truncated":
                flag[rows] = False
            else:  # "done" and "terminated", root and per agent
                flag[rows] = ended[rows].reshape(-1, *([1] * (flag.dim() - 1))).expand_as(flag[rows])

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        rows: Any = slice(None) if mask is None else mask.reshape(-1).to(torch.bool)
        self.counter[rows] += RESET_JUMP
        self._in_episode[rows] = 0
        self._write_obs(out, rows, None)
        self._write_flags(out, rows, None)

    def step_and_reset_into(self, action: Any, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._check_open()
        taken = {g: action.get((g, "action")) for g in self.groups}
        self.counter += 1
        self._in_episode += 1
        ended = self._in_episode >= self.episode_length
        every = slice(None)
        self._write_obs(next_out, every, taken)
        for group, k in self.groups.items():
            reward = REWARD_SCALE * taken[group].to(torch.float32) + torch.arange(k, dtype=torch.float32)
            next_out.get((group, "reward")).copy_(reward.unsqueeze(-1))
        self._write_flags(next_out, every, ended)
        if bool(ended.any()):
            self.counter[ended] += RESET_JUMP
            self._in_episode[ended] = 0
        self._write_obs(root_out, every, taken)
        if bool(ended.any()):
            self._write_obs(root_out, ended, None)
        self._write_flags(root_out, every, None)

    def _close(self) -> None:
        pass


def assert_group_counting_batch(batch: TensorDictBase, groups: Mapping[str, int] | None = None) -> None:
    """Asserts that every frame of a batch collected from :class:`GroupCountingEnv` is real, for every agent.

    ``batch`` has the collector layout ``[..., T]`` (time last, not split into trajectories). Checks at every step:
    the counter went up by one; the next observation echoes the action stored (the env was stepped with it); the
    reward is the one that action earned; each group's flags equal the root ones; and between steps, that nothing was
    lost or repeated (the next step starts where this one ended, a reset ``RESET_JUMP`` higher, with no previous
    action).

    Raises:
        AssertionError: naming the group and the first offending position.
    """
    done = batch.get(("next", "done")).reshape(*batch.batch_size)
    for group, k in dict(DEFAULT_GROUPS if groups is None else groups).items():
        obs = batch.get((group, "observation")).to(torch.float64)
        nxt = batch.get(("next", group, "observation")).to(torch.float64)
        action = batch.get((group, "action")).to(torch.float64)
        reward = batch.get(("next", group, "reward")).squeeze(-1).to(torch.float64)
        agents = torch.arange(k, dtype=torch.float64)
        checks = {
            "not a real transition": nxt[..., 0] - obs[..., 0] != 1,
            "the next observation does not echo the action stored": nxt[..., 1] != action,
            "a reward that is not the action's": reward != REWARD_SCALE * action + agents,
            "an agent index out of place": (obs[..., 2] != agents) | (nxt[..., 2] != agents),
        }
        for flag in DONE_KEYS:
            root = batch.get(("next", flag)).reshape(*batch.batch_size, 1)
            checks[f"('next', {group!r}, {flag!r}) is not the root flag"] = batch.get(("next", group, flag)).squeeze(
                -1
            ) != root.expand(*batch.batch_size, k)
        ended = done[..., :-1].unsqueeze(-1)
        expected_counter = nxt[..., :-1, :, 0] + RESET_JUMP * ended
        expected_previous = torch.where(ended, torch.full_like(action[..., :-1, :], -1.0), action[..., :-1, :])
        gap = (obs[..., 1:, :, 0] != expected_counter) | (obs[..., 1:, :, 1] != expected_previous)
        checks["a gap or a repeat between steps"] = torch.cat([torch.zeros_like(gap[..., :1, :]), gap], dim=-2)
        for what, bad in checks.items():
            if bool(bad.any()):
                where = tuple(bad.nonzero()[0].tolist())
                at = where[:-1]  # the frame (the agent is the last index)
                raise AssertionError(
                    f"{what} in group {group!r} at {where}: obs={obs[at].tolist()} next={nxt[at].tolist()} "
                    f"action={action[at].tolist()}"
                )
