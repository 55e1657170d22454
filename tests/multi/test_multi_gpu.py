"""Multi-process collectors with CUDA policies in the workers. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from acollect import MultiSyncCollector
from acollect.testing import CountingEnv

pytestmark = pytest.mark.gpu


class Greedy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


async def test_workers_run_the_policy_on_cuda_and_take_weight_pushes(start_method: str) -> None:
    source = Greedy()
    async with MultiSyncCollector(
        [lambda: CountingEnv(num_envs=2)] * 2, policy_factory=Greedy, frames_per_batch=16, total_frames=64,
        policy_device="cuda", start_method=start_method,
    ) as collector:  # fmt: skip
        first = await anext(collector)
        with torch.no_grad():
            source.net.weight.zero_()
            source.net.bias.copy_(torch.tensor([0.0, 1.0]))
        await collector.update_policy_weights_(source)
        second = await anext(collector)
    assert first["observation"].device.type == "cpu"
    obs, nxt = second["observation"], second["next", "observation"]
    assert torch.equal(nxt - obs, torch.ones_like(obs))
    assert second["action"].unique().tolist() == [1]
    assert second["collector", "policy_version"].unique().tolist() == [1]


async def test_batches_land_on_the_trainers_storing_device(start_method: str) -> None:
    async with MultiSyncCollector(
        [lambda: CountingEnv(num_envs=2)] * 2, None, frames_per_batch=16, total_frames=32,
        storing_device="cuda", start_method=start_method,
    ) as collector:  # fmt: skip
        batch = await anext(collector)
    assert batch["observation"].device.type == "cuda"
    assert batch["next", "reward"].device.type == "cuda"
