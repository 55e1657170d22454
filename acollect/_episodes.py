"""Episodes read from batches: the returns and lengths of the episodes that ended, counted across batches.

:class:`EpisodeTracker` reads ``("next", "reward")`` and ``("next", "done")`` of each ``[..., T]`` batch and reports
the episodes that ended in it (:class:`EpisodeSummary`). It keeps a running return and length per env across
batches, so an episode that spans several batches is counted whole. It is vectorised (no Python loop over steps),
so it runs beside the rollout engine, in the collection thread or in a worker, at a cost far below one step of a
batch. An :class:`EpisodeSummary` travels in a batch header as a small dict (:meth:`EpisodeSummary.to_header`), so
a worker reports its episodes without any extra message. Both are public as names of :mod:`acollect.stats`.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> tracker = EpisodeTracker()
    >>> def batch(rewards, dones):
    ...     r = torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1)
    ...     d = torch.tensor(dones).unsqueeze(-1)
    ...     return TensorDict({("next", "reward"): r, ("next", "done"): d}, batch_size=r.shape[:2])
    >>> tracker.update(batch([[1, 1, 1]], [[False, False, False]])).count  # nothing ended yet
    0
    >>> summary = tracker.update(batch([[1, 1, 1]], [[False, True, False]]))  # 5 steps, started last batch
    >>> summary.count, summary.returns, summary.lengths
    (1, [5.0], [5])

A multi-agent batch has a reward per group of agents, ``("next", group, "reward")`` of shape ``[..., T, n_agents, 1]``:
an episode ends with the root ``done``, its return per group is summed over the group's agents, and its return is
the sum over the groups.

    >>> tracker = EpisodeTracker()
    >>> td = TensorDict({("next", "red", "reward"): torch.ones(1, 2, 2, 1), ("next", "blue", "reward"): torch.ones(1, 2, 1, 1),
    ...                  ("next", "done"): torch.tensor([[[False], [True]]])}, batch_size=[1, 2])
    >>> summary = tracker.update(td)
    >>> summary.returns, summary.groups
    ([6.0], {'red': [4.0], 'blue': [2.0]})
"""  # noqa: E501

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

__all__ = ["EPISODE_WINDOW", "EpisodeSummary", "EpisodeTracker"]

#: Episodes kept for the mean return and length (as most RL libraries report it).
EPISODE_WINDOW = 100
# Episode lists in a batch header are capped: the mean only ever needs the last EPISODE_WINDOW.
_HEADER_CAP = EPISODE_WINDOW


@dataclass(frozen=True)
class EpisodeSummary:
    """The episodes that ended within one batch, in the order they ended.

    Attributes:
        count: episodes that ended (may exceed ``len(returns)`` when sent capped in a header).
        returns: the undiscounted return of each, summed over every step of the episode (and over every agent).
        lengths: the number of steps of each.
        groups: for a multi-agent env, the return of each episode per group of agents, summed over the group's
            agents (empty for one reward key).
    """

    count: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    groups: dict[str, list[float]] = field(default_factory=dict)

    def to_header(self) -> dict[str, Any]:
        """A msgpack-ready dict for a batch header (the last :data:`EPISODE_WINDOW` episodes at most).

        Examples:
            >>> EpisodeSummary(2, [1.5, 3.0], [2, 4]).to_header()
            {'n': 2, 'r': [1.5, 3.0], 'l': [2, 4]}
        """
        header = {"n": self.count, "r": self.returns[-_HEADER_CAP:], "l": self.lengths[-_HEADER_CAP:]}
        if self.groups:
            header["g"] = {name: returns[-_HEADER_CAP:] for name, returns in self.groups.items()}
        return header

    @classmethod
    def from_header(cls, fields: Mapping[str, Any] | None) -> EpisodeSummary:
        """Reads what :meth:`to_header` wrote; ``None`` (a header without episodes) gives an empty summary.

        Examples:
            >>> EpisodeSummary.from_header({'n': 2, 'r': [1.5, 3.0], 'l': [2, 4]}).returns
            [1.5, 3.0]
        """
        if not fields:
            return cls()
        returns = [float(x) for x in fields.get("r", ())]
        lengths = [int(x) for x in fields.get("l", ())]
        groups = {str(name): [float(x) for x in values] for name, values in (fields.get("g") or {}).items()}
        return cls(int(fields.get("n", len(returns))), returns, lengths, groups)


class EpisodeTracker:
    """Episode returns and lengths from a stream of ``[..., T]`` batches of one set of envs.

    Each call to :meth:`update` takes the next batch of the same envs (the last batch dim is time)
    and returns the episodes that ended in it. A running return and length per env carry an episode
    over batch boundaries. When the batch has ``("collector", "traj_ids")``, an env whose first
    trajectory id differs from the last one seen was reset in between (a seed, ``reset_at_each_iter``)
    and its running episode is dropped rather than merged with the new one.

    A batch with group rewards (``("next", group, "reward")``) and no root one gives each episode's return per
    group (:attr:`EpisodeSummary.groups`). Batches without ``("next", "done")`` or any reward report no episodes.
    """

    def __init__(self) -> None:
        self._running: dict[str | None, _Running] = {}  # per group (None: the root reward)

    def reset(self) -> None:
        """Forgets every running episode."""
        self._running.clear()

    def update(self, batch: TensorDictBase) -> EpisodeSummary:
        """Accounts for one batch and returns the episodes that ended in it."""
        if batch.batch_dims < 1:
            return EpisodeSummary()
        rewards = _rewards(batch)
        done = batch.get(("next", "done"), None)
        if not rewards or done is None:
            return EpisodeSummary()
        traj = batch.get(("collector", "traj_ids"), None)
        shape = batch.batch_size
        steps = shape[-1]
        # Per-agent rewards and flags (trailing dims past the batch dims) are summed and or-ed.
        d = np.asarray(_host(done).reshape(-1, steps, _trailing(done, shape)).any(-1))
        t = _host(traj).reshape(-1, steps) if isinstance(traj, torch.Tensor) and traj.shape == shape else None
        summaries = {}
        for group, reward in rewards.items():
            r = np.asarray(_host(reward).reshape(-1, steps, _trailing(reward, shape)).sum(-1))
            summaries[group] = self._running.setdefault(group, _Running()).update(r, d, t)
        if None in summaries:
            return summaries[None]
        first = next(iter(summaries.values()))
        total = np.sum([summary.returns for summary in summaries.values()], axis=0)  # the same episodes, in order
        groups = {str(group): summary.returns for group, summary in summaries.items()}
        return EpisodeSummary(first.count, total.tolist(), first.lengths, groups)


def _rewards(batch: TensorDictBase) -> dict[str | None, torch.Tensor]:
    """The root reward (``{None: ...}``), or each group's (``{group: ...}``), of a batch's ``"next"``."""
    reward = batch.get(("next", "reward"), None)
    if isinstance(reward, torch.Tensor):
        return {None: reward}
    nxt = batch.get("next", None)
    if not isinstance(nxt, TensorDictBase):
        return {}
    groups: dict[str | None, torch.Tensor] = {}
    for key in nxt.keys(include_nested=True, leaves_only=True):
        if isinstance(key, tuple) and len(key) > 1 and key[-1] == "reward":
            groups["/".join(key[:-1])] = nxt.get(key)
    return groups


class _Running:
    """The running return and length of each env's episode in flight, for one reward."""

    def __init__(self) -> None:
        self._return: np.ndarray | None = None  # float64 [N]
        self._length: np.ndarray | None = None  # int64 [N]
        self._last_traj: np.ndarray | None = None  # int64 [N]

    def update(self, reward: np.ndarray, done: np.ndarray, traj_ids: np.ndarray | None) -> EpisodeSummary:
        # [envs, T] numpy arrays: a few kilobytes, where numpy's per-call cost is a fraction of torch's (this
        # runs once per batch beside the rollout engine).
        steps = reward.shape[1]
        r = reward.astype(np.float64, copy=False)
        d = done.astype(bool, copy=False)
        n = r.shape[0]
        carry_r, carry_l = self._carry(n, traj_ids)
        if traj_ids is not None:
            self._last_traj = traj_ids[:, -1].astype(np.int64)
        ends = d.any(1)
        if not ends.any():  # the common case for long episodes: only the running sums move
            self._return, self._length = carry_r + r.sum(1), carry_l + steps
            return EpisodeSummary()
        # Cumulated return including what each env's running episode had before this batch; an episode's
        # return is the cumulated return at its end minus that at the previous end in its row.
        cum = np.cumsum(r, axis=1)
        cum += carry_r[:, None]
        index = np.arange(steps)
        last_end = np.maximum.accumulate(np.where(d, index, -1), axis=1)
        final = last_end[:, -1]
        rows = np.arange(n)
        self._return = np.where(ends, cum[:, -1] - cum[rows, np.maximum(final, 0)], cum[:, -1])
        self._length = np.where(ends, steps - 1 - final, carry_l + steps)
        # The finished episodes, ordered by the step they ended at (env order within a step).
        at_t, at_e = np.nonzero(d.T)
        prev = np.where(at_t > 0, last_end[at_e, np.maximum(at_t - 1, 0)], -1)
        first = prev < 0
        returns = cum[at_e, at_t] - np.where(first, 0.0, cum[at_e, np.maximum(prev, 0)])
        lengths = at_t - prev + np.where(first, carry_l[at_e], 0)
        return EpisodeSummary(int(at_t.size), returns.tolist(), lengths.tolist())

    def _carry(self, n: int, traj_ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if self._return is None or self._length is None or self._return.shape[0] != n:
            return np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
        carry_r, carry_l = self._return, self._length
        if traj_ids is not None and self._last_traj is not None:
            same = traj_ids[:, 0] == self._last_traj
            carry_r = np.where(same, carry_r, 0.0)
            carry_l = np.where(same, carry_l, 0)
        return carry_r, carry_l


def _trailing(tensor: torch.Tensor, batch_shape: torch.Size) -> int:
    """Number of elements per frame past the batch dims (1 for ``[*batch, 1]`` rewards)."""
    return math.prod(tensor.shape[len(batch_shape) :])


def _host(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a numpy array on the host (no copy for a CPU tensor)."""
    host = tensor.detach().cpu()
    return (host.float() if host.dtype == torch.bfloat16 else host).numpy()  # numpy has no bfloat16
