"""The in-process Collector across devices (CUDA), each batch checked value by value against a CPU reference run.
Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from acollect import Collector, ReplayBuffer
from acollect.testing import CountingEnv, assert_counting_batch

pytestmark = pytest.mark.gpu


class Greedy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


class Parity(torch.nn.Module):
    """Acts the parity of the counter it observes: exact on any device, and a different action every step."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("zero", torch.zeros(()))  # where it lives is where it runs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 0] + self.zero).long() % 2


def assert_same_values(batch: TensorDictBase, reference: TensorDictBase, device: str) -> None:
    """Every leaf of ``batch`` lies on ``device`` and equals ``reference``'s (on the CPU) value by value."""
    assert set(batch.keys(True, True)) == set(reference.keys(True, True))
    for key, value in batch.items(True, True):
        assert value.device.type == device, f"{key} on {value.device}"
        assert value.dtype == reference[key].dtype, key
        assert torch.equal(value.cpu(), reference[key]), f"{key} differs from the CPU reference"


async def _batches(device: str) -> list[TensorDictBase]:
    """The batches of a collector whose policy runs on ``device`` and whose batches are stored there."""
    async with Collector(lambda: CountingEnv(num_envs=4), Parity(), frames_per_batch=32, total_frames=96,
                         policy_device=device, storing_device=device) as c:  # fmt: skip
        batches = [await anext(c)]
        assert c.policy.zero.device.type == device
        return batches + [batch async for batch in c]


async def test_policy_on_cuda_env_on_cpu_batches_on_storing_device() -> None:
    batches = await _batches("cuda")
    assert batches[0]["action"].unique().tolist() == [0, 1]
    reference = await _batches("cpu")
    assert len(batches) == len(reference) == 3
    for batch, expected in zip(batches, reference, strict=True):
        assert batch.device.type == "cuda"
        assert_same_values(batch, expected, "cuda")
        assert_counting_batch(batch.cpu())


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
        batch = await anext(c)
        rb.extend(batch)
    assert len(rb) == 8
    # What the buffer holds is the batch, transition by transition (flattened env-major, as extend takes it).
    stored = TensorDict(rb.state_dict()["storage"], batch_size=[8])
    expected = batch.cpu().reshape(-1)
    for key in ("observation", ("next", "observation"), ("next", "reward"), ("next", "done"), "action"):
        assert torch.equal(stored[key].cpu(), expected[key]), key
    assert torch.equal(stored["next", "observation"] - stored["observation"], torch.ones(8, 1))
