"""The keys of one transition of an env, as the rollout engine stores them: observations, actions, rewards, flags.

A single-agent env has ``"action"``, ``"reward"`` and the root ``"done"``, ``"terminated"`` and ``"truncated"``;
a multi-agent one names its own (:mod:`acollect.envs._base`), such as ``("agents", "action")``,
``("agents", "reward")`` and ``("agents", "done")`` beside the root flags.

Examples:
    >>> from acollect.testing import GroupCountingEnv
    >>> keys = TransitionKeys.of(GroupCountingEnv(groups={"agents": 2}))
    >>> keys.rewards, keys.flags
    ([('agents', 'reward')], [('agents', 'done'), ('agents', 'terminated'), ('agents', 'truncated')])
    >>> keys.cuts
    [('done',), ('truncated',), ('agents', 'done'), ('agents', 'truncated')]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDictBase

from acollect._policy import NestedKey
from acollect.envs import DONE_KEYS, EnvBase

__all__ = ["Key", "TransitionKeys"]

Key = tuple[str, ...]


@dataclass
class TransitionKeys:
    """What a transition of one env holds, by key.

    Attributes:
        observations: the observation keys, in root and ``"next"``.
        rewards: the reward keys, in ``"next"``.
        flags: the done flags beside the root ones (a group's), copied at every step in root and ``"next"``.
        cuts: the flags a truncation sets: the root ``"done"`` and ``"truncated"``, and each group's.
        actions: for a composite action spec, each action key with the policy's own key for it (learnt from its
            first outputs); empty for a plain ``"action"``.
    """

    observations: list[Key]
    rewards: list[Key]
    flags: list[Key]
    cuts: list[Key]
    actions: list[tuple[Key, NestedKey]] = field(default_factory=list)

    @classmethod
    def of(cls, env: EnvBase) -> TransitionKeys:
        """The keys of ``env``'s transitions (the actions are learnt later, from the policy)."""
        done_keys = env.done_keys
        return cls(
            observations=env.observation_spec.leaf_keys(),
            rewards=env.reward_keys,
            flags=done_keys[len(DONE_KEYS) :],
            cuts=[key for key in done_keys if key[-1] in ("truncated", "done")],
        )

    def cut(self, td: TensorDictBase, at: tuple[object, ...], rows: torch.Tensor) -> None:
        """Marks the episodes of ``rows`` (bool ``[n_envs]``) truncated in ``td`` at index ``at`` (``()``: ``td``
        is one step): the root flags and every group's (an episode ends for all of a group's agents)."""
        if not bool(rows.any()):
            return
        for key in self.cuts:
            flag = td.get(key)[at] if at else td.get(key)
            flag[rows] = True
