"""Central inference with the server on CUDA and the env workers on CPU. Skipped without a GPU."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, InferenceServer
from acollect.testing import CountingEnv, WeightProbe, assert_counting_batch

pytestmark = pytest.mark.gpu


async def test_the_server_runs_the_policy_on_cuda_and_cpu_workers_get_cpu_actions(start_method: str) -> None:
    policy = TensorDictModule(WeightProbe(0.0), in_keys=["observation"], out_keys=["action"])
    env = functools.partial(CountingEnv, num_envs=4)
    async with AsyncBatchedCollector(
        [env] * 2, policy, device="cuda", frames_per_batch=16, total_frames=160, start_method=start_method
    ) as collector:
        policy_device = collector.server.policy_device  # the server process's own copy, as its hello said
        assert policy_device is not None
        assert policy_device.type == "cuda"
        await collector.update_policy_weights_(TensorDictModule(WeightProbe(1.0), ["observation"], ["action"]))
        async for batch in collector:
            assert batch.device == torch.device("cpu")
            assert_counting_batch(batch)
            assert (batch["action"] == batch["collector", "policy_version"]).all()
        assert batch["action"].eq(1).all()


async def test_in_process_callers_get_answers_from_a_cuda_policy() -> None:
    net = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    async with InferenceServer(net, device="cuda", max_wait=0.0) as server:
        assert server.policy_device is not None
        assert server.policy_device.type == "cuda"
        out = await server.infer(TensorDict({"observation": torch.ones(3, 4)}, [3]))
    expected = net(TensorDict({"observation": torch.ones(3, 4)}, [3]))["action"]
    torch.testing.assert_close(out["action"], expected)
    assert out["action"].device.type == "cpu"
