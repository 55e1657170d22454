"""Multi-process collectors with CUDA policies in the workers, or batches stored on a GPU (checked value by value
against a CPU run). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase

from acollect import MultiSyncCollector
from acollect.testing import CountingEnv, WeightProbe, assert_counting_batch

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


async def _stacked_batches(device: str, start_method: str) -> list[TensorDictBase]:
    async with MultiSyncCollector(
        [lambda: CountingEnv(num_envs=2)] * 2, WeightProbe(0.0), frames_per_batch=16, total_frames=48,
        storing_device=device, start_method=start_method,
    ) as collector:  # fmt: skip
        return [batch async for batch in collector]


async def test_batches_land_on_the_trainers_storing_device(start_method: str) -> None:
    # Lockstep batches of counting envs and a deterministic policy are the same on every run: the CPU run is the
    # reference each GPU batch is checked against, value by value.
    batches = await _stacked_batches("cuda", start_method)
    reference = await _stacked_batches("cpu", start_method)
    assert len(batches) == len(reference) == 3
    for batch, expected in zip(batches, reference, strict=True):
        assert set(batch.keys(True, True)) == set(expected.keys(True, True))
        for key, value in batch.items(True, True):
            assert value.device.type == "cuda", f"{key} on {value.device}"
            assert torch.equal(value.cpu(), expected[key]), f"{key} differs from the CPU reference"
        assert_counting_batch(batch.cpu())
