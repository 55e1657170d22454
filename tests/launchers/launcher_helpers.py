"""A policy the launcher tests send to Ray actors and submitit jobs (importable there by module name)."""

from __future__ import annotations

import torch


class WeightProbe(torch.nn.Module):
    """Acts with ``clamp(w, 0, 1)``: the action in a batch shows which weights collected it."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), value))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).clamp(0, 1).long()
