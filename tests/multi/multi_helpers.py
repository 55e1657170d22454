"""Envs and policies the multi-process tests send to workers (importable there by module name)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


class WeightProbe(torch.nn.Module):
    """Acts with ``clamp(w, 0, 1)``: the action in a batch shows which weights collected it."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), value))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).clamp(0, 1).long()


class TwoPartProbe(torch.nn.Module):
    """Acts with ``clamp(a.w * b.w, 0, 1)``: two sub-models, for multi-model weight updates."""

    def __init__(self) -> None:
        super().__init__()
        self.a = WeightProbe(0.0)
        self.b = WeightProbe(0.0)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.a.w * self.b.w).clamp(0, 1).long()


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
