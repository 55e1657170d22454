"""Policies of the multi-process tests that are about workers only (importable there by module name), and
:class:`TrajectoryIds`, the check that no trajectory id is handed out twice.

The probe policies (``WeightProbe``, ``TwoPartProbe``) live in :mod:`acollect.testing`.
"""

from __future__ import annotations

import os

import torch
from tensordict import TensorDictBase

from acollect.testing import WeightProbe


def report_threads(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that acts 0 and writes the worker's torch thread count as ``"threads"``."""
    n = td.batch_size[0]
    td.set("action", torch.zeros(n, dtype=torch.int64))
    td.set("threads", torch.full((n,), torch.get_num_threads(), dtype=torch.int64))
    return td


class NestedProbe(torch.nn.Module):
    """A :class:`WeightProbe` one level down (``net.0.w``), so its state dict has dotted keys."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(WeightProbe(value))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation)


def nested_probe() -> NestedProbe:
    """A ``policy_factory``: the trainer never sees the policy the workers build."""
    return NestedProbe(0.0)


def writes_logits(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that forgets to write ``"action"``: refused when a worker builds it."""
    return td.set("logits", torch.zeros(td.batch_size[0], 2))


class ActsSeven(torch.nn.Module):
    """A policy whose action (7) is outside CartPole's ``Discrete(2)``."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.full((observation.shape[0],), 7)


def report_cores(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that acts 0 and writes the cores its thread may run on (a bit mask) as ``"cores"``, and
    its torch thread count as ``"threads"`` (Linux: it reads ``os.sched_getaffinity``)."""
    n = td.batch_size[0]
    mask = sum(1 << core for core in os.sched_getaffinity(0))
    td.set("action", torch.zeros(n, dtype=torch.int64))
    td.set("cores", torch.full((n,), mask, dtype=torch.int64))
    td.set("threads", torch.full((n,), torch.get_num_threads(), dtype=torch.int64))
    return td


class TrajectoryIds:
    """Every trajectory id handed out so far, to check that none is handed out twice (across worker restarts too).

    Fed the batches in the order they came (``[..., n_envs, T]``, from counting envs), it asserts that each id lies
    in one env's row only, and that an id of an earlier batch comes back only as the trajectory its env's row
    ended the previous batch with, continued: the row's first observation is where that row stopped, no episode
    ended in between. A restarted worker's envs start afresh, so every id in its first batch must be new.
    """

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.batches = 0
        self._tails: list[tuple[int, float, bool]] | None = None  # per row: last id, last next obs, done

    def feed(self, batch: TensorDictBase) -> None:
        ids = batch["collector", "traj_ids"]
        steps = ids.shape[-1]
        ids = ids.reshape(-1, steps)
        obs = batch["observation"][..., 0].reshape(-1, steps)
        after = batch["next", "observation"][..., 0].reshape(-1, steps)
        done = batch["next", "done"].reshape(-1, steps)
        owner: dict[int, int] = {}
        for row in range(ids.shape[0]):
            for traj in set(ids[row].tolist()):
                assert owner.setdefault(traj, row) == row, f"batch {self.batches}: id {traj} in two rows"
        for row in range(ids.shape[0]):
            carried: set[int] = set()
            if self._tails is not None:
                last, where, ended = self._tails[row]
                if not ended and obs[row, 0].item() == where:  # the same trajectory, going on
                    carried = {last}
            again = (set(ids[row].tolist()) & self.seen) - carried
            assert not again, (
                f"batch {self.batches}, row {row} (first observation {obs[row, 0].item()}): trajectory ids "
                f"{sorted(again)} were handed out in an earlier batch"
            )
        self.seen |= set(ids.flatten().tolist())
        self._tails = [(int(ids[row, -1]), after[row, -1].item(), bool(done[row, -1])) for row in range(ids.shape[0])]
        self.batches += 1
