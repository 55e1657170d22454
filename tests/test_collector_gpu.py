"""The in-process Collector across devices (CUDA). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from acollect import Collector, ReplayBuffer
from acollect.testing import CountingEnv

pytestmark = pytest.mark.gpu


class Greedy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


async def test_policy_on_cuda_env_on_cpu_batches_on_storing_device() -> None:
    async with Collector(
        lambda: CountingEnv(num_envs=4), Greedy(), frames_per_batch=32, policy_device="cuda", storing_device="cuda"
    ) as c:
        batch = await anext(c)
        assert c.policy.net.weight.device.type == "cuda"
    assert batch.device.type == "cuda"
    assert batch["observation"].device.type == "cuda"
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert torch.equal(nxt - obs, torch.ones_like(obs))


async def test_device_fills_all_and_weights_cross_devices() -> None:
    source = Greedy()
    with torch.no_grad():
        source.net.weight.zero_()
        source.net.bias.copy_(torch.tensor([0.0, 1.0]))
    async with Collector(
        lambda: CountingEnv(num_envs=2), policy_factory=Greedy, frames_per_batch=8, policy_device="cuda"
    ) as c:
        await c.update_policy_weights_(source)  # CPU weights into a CUDA policy
        batch = await anext(c)
    assert batch.device.type == "cpu"  # storing follows the env
    assert batch["action"].unique().tolist() == [1]
    assert batch["collector", "policy_version"].unique().tolist() == [1]


async def test_cuda_batches_fill_a_cpu_buffer() -> None:
    rb = ReplayBuffer(1000)
    async with Collector(lambda: CountingEnv(num_envs=2), None, frames_per_batch=8, storing_device="cuda:0") as c:
        rb.extend(await anext(c))
    assert len(rb) == 8
