"""Policies of the multi-process tests that are about workers only (importable there by module name).

The probe policies (``WeightProbe``, ``TwoPartProbe``) live in :mod:`acollect.testing`.
"""

from __future__ import annotations

import os
import time

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


def stamp_time(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that acts 0 and writes when it chose, as ``"stamp"`` (``time.monotonic()``, which every
    process of a host reads from one clock)."""
    n = td.batch_size[0]
    td.set("action", torch.zeros(n, dtype=torch.int64))
    td.set("stamp", torch.full((n,), time.monotonic(), dtype=torch.float64))
    return td


def report_cores(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that acts 0 and writes the cores its thread may run on (a bit mask) as ``"cores"``, and
    its torch thread count as ``"threads"`` (Linux: it reads ``os.sched_getaffinity``)."""
    n = td.batch_size[0]
    mask = sum(1 << core for core in os.sched_getaffinity(0))
    td.set("action", torch.zeros(n, dtype=torch.int64))
    td.set("cores", torch.full((n,), mask, dtype=torch.int64))
    td.set("threads", torch.full((n,), torch.get_num_threads(), dtype=torch.int64))
    return td
