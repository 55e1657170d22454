"""Envs and policies the multi-process tests send to workers (importable there by module name)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from acollect.envs.base import EnvBase
from acollect.specs import Categorical, Composite, Unbounded


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


class PixelEnv(EnvBase):
    """Synthetic ``84x84x4`` uint8 observations, no step cost: a transport workload."""

    def __init__(self, num_envs: int = 1, shape: tuple[int, ...] = (84, 84, 4)) -> None:
        self.batch_size = torch.Size([num_envs])
        self.observation_spec = Composite(pixels=Unbounded(shape, dtype=torch.uint8))
        self.action_spec = Categorical(2)
        self._t = 0

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        rows = slice(None) if mask is None else mask.reshape(-1)
        out.get("pixels")[rows] = 0
        for key in ("done", "terminated", "truncated"):
            out.get(key)[rows] = False

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._t += 1
        next_out.get("pixels").fill_(self._t % 251)
        next_out.get("reward").fill_(1.0)
        for key in ("done", "terminated", "truncated"):
            next_out.get(key).zero_()
        root_out.get("pixels").copy_(next_out.get("pixels"))

    def _close(self) -> None:
        pass


def report_threads(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that acts 0 and writes the worker's torch thread count as ``"threads"``."""
    n = td.batch_size[0]
    td.set("action", torch.zeros(n, dtype=torch.int64))
    td.set("threads", torch.full((n,), torch.get_num_threads(), dtype=torch.int64))
    return td
