"""The CUDA paths, each asserted against a CPU reference.

Every test runs on ``"cpu"`` here (the reference, and a check that the test itself holds) and on ``"cuda"`` where a
GPU is (``pytest -m gpu``). Each one would catch a fault of a CUDA path that values do not show without a GPU: an env
stepping with an action whose device-to-host copy has not landed, a pass reading half-copied weights, host memory
registered with CUDA and never unregistered (or freed while a copy reads it), a server killed by CUDA inputs.
"""

from __future__ import annotations

import functools
import gc

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import Collector, InferenceServer, MultiAsyncCollector, MultiSyncCollector
from acollect.envs import GymEnv
from acollect.testing import ENV_STRIDE, CountingEnv, EchoGymEnv, PixelEnv, assert_counting_batch

START_METHOD = "forkserver"  # workers forked from one process that imported everything once: quick to start
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
N_ACTIONS = 997  # prime: counter % N_ACTIONS gives every step of a batch its own action


class SlowCounterPolicy(torch.nn.Module):
    """Acts ``counter % N_ACTIONS``; on a GPU only after a busy wait of about a millisecond of GPU time, so that a
    copy of its action to the host that is not waited for is read long before it lands."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("zero", torch.zeros(()))  # where it lives is where it runs

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if observation.is_cuda:
            torch.cuda._sleep(2_000_000)
        return (observation[..., 0] + self.zero).long() % N_ACTIONS


@pytest.mark.parametrize("policy_device", DEVICES)
async def test_the_env_steps_with_the_action_the_batch_records(policy_device: str) -> None:
    policy = TensorDictModule(SlowCounterPolicy().to(policy_device), in_keys=["observation"], out_keys=["action"])
    env = functools.partial(GymEnv, functools.partial(EchoGymEnv, N_ACTIONS), num_envs=4)
    async with Collector(env, policy, frames_per_batch=64, total_frames=64 * 20, env_device="cpu") as collector:
        with anyio.fail_after(120):
            batches = [batch.cpu() async for batch in collector]
    assert len(batches) == 20
    for batch in batches:
        action, obs, echoed = batch["action"], batch["observation"], batch["next", "observation"]
        assert torch.equal(action, obs[..., 0].long() % N_ACTIONS), "the batch records the policy's own action"
        # What the env received, echoed into its next observation: the very action the batch records.
        assert torch.equal(echoed[..., 1].long(), action)


class WideConstant(torch.nn.Module):
    """Acts its last weight on every observation; its weights are large, so that copying them takes a while."""

    def __init__(self, value: float = 0.0, size: int = 1 << 22) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((size,), float(value)))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0] * 0 + self.w[-1]


@pytest.mark.parametrize("device", DEVICES)
async def test_a_pass_right_after_a_weight_push_answers_with_the_new_weights(device: str) -> None:
    policy = TensorDictModule(WideConstant(0.0), in_keys=["observation"], out_keys=["action"])
    obs = TensorDict({"observation": torch.zeros(8, 1)}, batch_size=[8])
    async with InferenceServer(policy, device=device, mode="thread", max_wait=0.0) as server:
        with anyio.fail_after(120):
            for k in range(1, 21):
                weights = TensorDict.from_module(WideConstant(float(k)).to(device))
                await server.update_policy_weights_(weights=weights)
                answer = (await server.infer(obs.clone()))["action"]
                assert answer.tolist() == [float(k)] * 8, f"push {k}: the pass read weights that had not all landed"


@pytest.mark.parametrize(
    ("server_device", "input_device"),
    [
        ("cpu", "cpu"),
        pytest.param("cpu", "cuda", marks=pytest.mark.gpu),
        pytest.param("cuda", "cuda", marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_infer_takes_observations_on_any_device_and_answers_on_theirs(
    server_device: str, input_device: str, mode: str
) -> None:
    from acollect.testing import Doubler

    policy = TensorDictModule(Doubler(), in_keys=["observation"], out_keys=["action"])
    async with InferenceServer(policy, device=server_device, mode=mode, max_wait=0.0) as server:
        with anyio.fail_after(120):
            for i in range(5):
                obs = TensorDict({"observation": torch.full((3, 2), float(i), device=input_device)}, batch_size=[3])
                action = (await server.infer(obs))["action"]
                assert action.device.type == input_device
                assert torch.equal(action.cpu(), torch.full((3, 2), 2.0 * i))
            assert server.running, "the server lives on after every call"


def _worker_of(batch: TensorDict, envs_per_worker: int) -> torch.Tensor:
    """Which worker made each frame of a counting batch whose worker ``w`` counts from ``w * envs * ENV_STRIDE``."""
    return (batch["observation"][..., 0] // (envs_per_worker * ENV_STRIDE)).long()


@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("device", DEVICES)
async def test_small_batches_stored_on_a_device_keep_their_values_and_pin_nothing(kind: type, device: str) -> None:
    # Heap memory only (frames through ZeroMQ, gathered into fresh memory): nothing may be registered with CUDA.
    envs = [functools.partial(CountingEnv, num_envs=4, episode_length=7, start=w * 4 * ENV_STRIDE,
                              dtype=torch.float64) for w in range(2)]  # fmt: skip
    n = 300 if device == "cuda" else 40
    async with kind(envs, None, frames_per_batch=64, total_frames=64 * n, storing_device=device,
                    use_shared_memory=False, start_method=START_METHOD) as collector:  # fmt: skip
        with anyio.fail_after(300):
            async for batch in collector:
                assert batch["observation"].device.type == device
                host = batch.cpu()
                assert_counting_batch(host)
                made_by = _worker_of(host, 4)
                if kind is MultiAsyncCollector:  # tagged per batch: the tag names the worker whose frames these are
                    assert torch.equal(host["collector", "worker_id"], made_by)
                else:  # stacked: row w is worker w's
                    assert torch.equal(made_by, torch.arange(2).view(2, 1, 1).expand_as(made_by))
                assert collector.pinned_bytes == 0


@pytest.mark.parametrize("device", DEVICES)
async def test_pixel_batches_go_by_dma_and_pinned_memory_stays_flat(device: str) -> None:
    envs = [functools.partial(PixelEnv, num_envs=8, shape=(16, 16, 4))] * 2
    n = 300 if device == "cuda" else 40
    pinned: list[int] = []
    async with MultiAsyncCollector(envs, None, frames_per_batch=128, total_frames=128 * n, storing_device=device,
                                   start_method=START_METHOD) as collector:  # fmt: skip
        with anyio.fail_after(300):
            async for batch in collector:
                host = batch.cpu()
                pixels, after = host["pixels"].long(), host["next", "pixels"].long()
                # Every frame one value, one step on from its observation (the step count modulo 251).
                assert torch.equal(after, (pixels + 1) % 251)
                assert torch.equal(pixels[:, 1:], after[:, :-1])
                assert host["collector", "worker_id"].unique().numel() == 1
                pinned.append(collector.pinned_bytes)
                gc.collect()
    if device == "cpu":
        assert set(pinned) == {0}
    else:
        assert pinned[-1] > 0, "the workers' slots are page-locked: the copy engine reads them directly"
        assert max(pinned) == pinned[-1] == pinned[len(pinned) // 2], "registered memory grows no more once warm"
    assert collector.pinned_bytes == 0, "unregistered before the pool unmapped its segments"


@pytest.mark.gpu
def test_the_copier_registers_only_segments_the_pool_owns_and_only_while_they_are_mapped() -> None:
    from acollect.transport.cuda_dma import DeviceCopier
    from acollect.transport.shm import ShmSegment

    copier = DeviceCopier(torch.device("cuda"))
    try:
        for i in range(200):  # heap temporaries, freed as soon as the copy returns
            heap = TensorDict({"x": torch.full((64, 16), float(i))}, batch_size=[64])
            copy = copier.copy(heap)
            del heap
            out = copier.hand_over(copy)
            assert out["x"].sum().item() == 64 * 16 * i
            copier.copied(copy)
        assert copier.registered_bytes == 0, "heap memory is never registered"
        for i in range(20):  # segments come and go: each one registered while mapped, unregistered before unmapped
            segment = ShmSegment.create(1 << 20)
            view = TensorDict({"x": segment.tensor().view(torch.float32)}, batch_size=[])
            view["x"].fill_(float(i))
            copy = copier.copy(view)
            assert copier.registered_bytes == 1 << 20
            assert copier.hand_over(copy)["x"].sum().item() == (1 << 18) * i
            copier.copied(copy)
            del view
            segment.close()
            segment.unlink()
            assert copier.registered_bytes == 0
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1)  # no CUDA error was left pending by any registration
    finally:
        copier.close()
