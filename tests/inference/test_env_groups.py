"""Env groups: a worker's envs in groups, each stepping while the others wait for their actions, and passes in flight.

Each scenario checks what must never change with the grouping: the batch layout, every step once in order, each
env acting on its own observation, the version of the weights behind every frame.
"""

from __future__ import annotations

import functools
from typing import Any

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, ConfigurationError, MultiAsyncCollector
from acollect.envs import AsyncEnvPool
from acollect.errors import WorkerError
from acollect.testing import AsyncCountingEnv, CountingEnv, WeightProbe, assert_counting_batch


class Parity(torch.nn.Module):
    """Acts the parity of the observation: an action given to the wrong env shows, half the time."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0].long() % 2


def envs() -> list[functools.partial[CountingEnv]]:
    return [functools.partial(CountingEnv, episode_length=4 + k, start=1000 * k) for k in range(2)]


def layout(batch: object) -> dict[object, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape), v.dtype) for k, v in batch.items(include_nested=True, leaves_only=True)}  # type: ignore[attr-defined]


KWARGS = {"frames_per_batch": 40, "env_kwargs": {"num_envs": 5}}  # groups of 2 and 3 envs, 8 steps a batch


@pytest.mark.parametrize(("groups", "in_flight"), [(2, 1), (3, 2)])
async def test_grouped_batches_keep_the_layout_every_step_once_and_each_env_its_own_actions(
    start_method: str, groups: int, in_flight: int
) -> None:
    policy = TensorDictModule(Parity(), in_keys=["observation"], out_keys=["action"])
    kwargs = {**KWARGS, "total_frames": 40 * 8, "start_method": start_method}
    with anyio.fail_after(90):
        async with MultiAsyncCollector(envs(), policy, **kwargs) as reference:
            expected = layout(await anext(reference))
        async with AsyncBatchedCollector(
            envs(), policy, env_groups=groups, passes_in_flight=in_flight, max_wait=0.01, **kwargs
        ) as collector:
            batches = [batch async for batch in collector]
            stats = collector.stats().inference
    assert len(batches) == 8
    owners: dict[int, int] = {}
    for batch in batches:
        assert layout(batch) == expected
        assert batch.names == [None, "time"]
        assert_counting_batch(batch)  # no step lost, repeated or taken from another env
        assert (batch["action"] == batch["observation"][..., 0].long() % 2).all(), "an env got another's action"
        worker = int(batch["collector", "worker_id"][0, 0])
        for traj in batch["collector", "traj_ids"].unique().tolist():
            assert owners.setdefault(traj, worker) == worker, f"trajectory id {traj} of two workers"
    assert stats is not None
    assert stats["slot_requests"] > 0
    assert stats["rows"] / stats["requests"] <= 5 / groups + 1, "each request holds one group's envs, not all 5"


@pytest.mark.parametrize(("groups", "in_flight"), [(2, 1), (5, 3)])
async def test_grouped_frames_say_which_weights_chose_them_and_a_pause_keeps_every_step(
    start_method: str, groups: int, in_flight: int
) -> None:
    trained = TensorDictModule(WeightProbe(0.0), in_keys=["observation"], out_keys=["action"])
    kwargs = {**KWARGS, "total_frames": -1, "start_method": start_method}
    batches = []
    with anyio.fail_after(90):
        async with AsyncBatchedCollector(
            envs(), trained, env_groups=groups, passes_in_flight=in_flight, credits=1, **kwargs
        ) as collector:
            async for batch in collector:
                batches.append(batch.clone())
                if len(batches) == 3:
                    with torch.no_grad():
                        trained.module.w.fill_(1.0)
                    assert await collector.update_policy_weights_() == 1
                if len(batches) == 5:
                    async with collector.pause():
                        await anyio.sleep(0.2)
                if len(batches) == 10:
                    break
    for batch in batches:
        version = batch["collector", "policy_version"]
        assert (batch["action"] == (version > 0).long()).all(), "each frame's version is the one that chose it"
        assert (version.diff(dim=1) >= 0).all(), "versions step up along time, never down"
        assert_counting_batch(batch)
    assert int(batches[-1]["collector", "policy_version"].min()) == 1


def async_pool(num_envs: int) -> AsyncEnvPool:
    return AsyncEnvPool(AsyncCountingEnv, num_envs)


async def test_coroutine_envs_step_as_one_group_by_default_and_refuse_groups_asked_for(start_method: str) -> None:
    # A pool's envs step while the others wait for their actions already: it is not split, and runs as one group.
    kwargs = {"frames_per_batch": 16, "total_frames": 32, "env_kwargs": {"num_envs": 4}, "start_method": start_method}
    with anyio.fail_after(90):
        async with AsyncBatchedCollector([async_pool], WeightProbe(1.0), **kwargs) as collector:
            batches = [batch async for batch in collector]
    assert [batch.batch_size for batch in batches] == [(4, 4), (4, 4)]
    assert all((batch["action"] == 1).all() for batch in batches)
    # Asked for by name, groups that cannot apply are refused, with the reason, not run as one group silently:
    # here by the worker that built the envs (a plain function says what it makes only when called).
    with anyio.fail_after(90), pytest.raises(WorkerError, match="coroutine envs") as caught:
        async with AsyncBatchedCollector([async_pool], WeightProbe(1.0), env_groups=2, **kwargs) as collector:
            await anext(collector)
    assert "ConfigurationError" in str(caught.value) or isinstance(caught.value.__cause__, ConfigurationError)


def test_env_groups_that_cannot_apply_are_refused_at_construction() -> None:
    kwargs: dict[str, Any] = {"frames_per_batch": 16, "env_groups": 4}
    with pytest.raises(ConfigurationError, match=r"env_groups=4.*num_envs.*None"):
        AsyncBatchedCollector([CountingEnv], WeightProbe(1.0), **kwargs)  # nothing to share out
    with pytest.raises(ConfigurationError, match=r"env_groups=4.*N >= 4"):
        AsyncBatchedCollector([CountingEnv], WeightProbe(1.0), env_kwargs={"num_envs": 3}, **kwargs)
    with pytest.raises(ConfigurationError, match=r"env_groups=4.*init_random_frames=64"):
        AsyncBatchedCollector([CountingEnv], WeightProbe(1.0), env_kwargs={"num_envs": 8}, init_random_frames=64,
                              **kwargs)  # fmt: skip
    pool = functools.partial(AsyncEnvPool, AsyncCountingEnv)
    with pytest.raises(ConfigurationError, match=r"env_groups=4.*coroutine envs"):
        AsyncBatchedCollector([pool], WeightProbe(1.0), env_kwargs={"num_envs": 8}, **kwargs)
    # What applies is taken: one group per env at most, and None or 1 anywhere.
    AsyncBatchedCollector([CountingEnv], WeightProbe(1.0), env_kwargs={"num_envs": 4}, **kwargs)
    AsyncBatchedCollector([CountingEnv], WeightProbe(1.0), frames_per_batch=16, env_groups=1)
