"""AsyncBatchedCollector: env workers, actions from the inference server, the layout of every other collector."""

from __future__ import annotations

import functools

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, CollectorState, ConfigurationError, MultiAsyncCollector
from acollect.errors import InferencePolicyError
from acollect.testing import CountingEnv, assert_counting_batch


class Parity(torch.nn.Module):
    """Acts the parity of the observation: an action given to the wrong env shows, half the time."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0].long() % 2


def policy() -> TensorDictModule:
    return TensorDictModule(Parity(), in_keys=["observation"], out_keys=["action"])


def envs() -> list[functools.partial[CountingEnv]]:
    # Different starts and episode lengths per worker: every env's observations are its own.
    return [functools.partial(CountingEnv, num_envs=3, episode_length=4 + k, start=1000 * k) for k in range(2)]


def layout(batch: object) -> dict[object, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape), v.dtype) for k, v in batch.items(include_nested=True, leaves_only=True)}  # type: ignore[attr-defined]


async def test_same_layout_as_multi_async_every_step_once_and_each_env_acted_on_its_own_observation(
    start_method: str,
) -> None:
    kwargs = {"frames_per_batch": 18, "total_frames": 18 * 6, "start_method": start_method}
    with anyio.fail_after(90):
        async with MultiAsyncCollector(envs(), policy(), **kwargs) as reference:
            expected = layout(await anext(reference))
        async with AsyncBatchedCollector(envs(), policy(), max_wait=0.01, **kwargs) as collector:
            batches = [batch async for batch in collector]
            stats = collector.stats()
    assert len(batches) == 6
    for batch in batches:
        assert layout(batch) == expected  # same keys, shapes and dtypes
        assert_counting_batch(batch)  # no step lost, repeated or taken from another env
        assert (batch["action"] == batch["observation"][..., 0].long() % 2).all(), "an env got another's action"
        assert (batch["collector", "policy_version"] == 0).all()
    worker_ids = {int(b["collector", "worker_id"][0, 0]) for b in batches}
    assert worker_ids == {0, 1}
    assert stats.inference is not None
    assert stats.inference["rows"] >= 18 * 6
    assert stats.inference["passes"] > 0
    assert 0 < stats.inference["fill_rate"] <= 1
    assert stats.inference["slot_requests"] > 0, "same-host workers step through shared-memory slots"


@pytest.mark.parametrize("server", ["process", "thread"])
async def test_a_policy_that_raises_in_the_server_breaks_the_collector_with_its_traceback(
    start_method: str, server: str
) -> None:
    class Broken(torch.nn.Module):
        calls = 0

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            type(self).calls += 1
            if type(self).calls > 3:  # after the workers' first probe steps: mid-collection
                raise ValueError("the policy broke")
            return torch.zeros(observation.shape[0], dtype=torch.long)

    collector = AsyncBatchedCollector(envs(), Broken(), frames_per_batch=18, start_method=start_method, server=server)
    with anyio.fail_after(60):
        try:
            if server == "thread":  # the policy's own exception, raised in this process
                with pytest.raises(ValueError, match="the policy broke") as info:
                    async for _ in collector:
                        pass
                assert any(entry.name == "forward" for entry in info.traceback)
            else:  # the server process's report: the type, the message and the traceback from there
                with pytest.raises(InferencePolicyError, match="the policy broke") as failed:  # a PolicyError
                    async for _ in collector:
                        pass
                assert failed.value.type_name == "builtins.ValueError"
                assert "in forward" in failed.value.remote_traceback
                assert failed.value.pid is not None
            assert collector.state is CollectorState.BROKEN
        finally:
            await collector.async_shutdown()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConfigurationError, match="policy"):
        AsyncBatchedCollector(envs(), None, frames_per_batch=8)
    with pytest.raises(ConfigurationError, match="max_batch_size"):
        AsyncBatchedCollector(envs(), policy(), frames_per_batch=8, max_batch_size=0)
    with pytest.raises(ConfigurationError, match="max_wait"):
        AsyncBatchedCollector(envs(), policy(), frames_per_batch=8, max_wait=-1)
    with pytest.raises(ConfigurationError, match="device"):
        AsyncBatchedCollector(envs(), policy(), frames_per_batch=8, device=["cpu", "cpu"])


async def test_state_dict_carries_the_servers_weights_and_version_to_a_new_collector(start_method: str) -> None:
    from acollect.testing import WeightProbe

    def probe(value: float) -> TensorDictModule:
        return TensorDictModule(WeightProbe(value), in_keys=["observation"], out_keys=["action"])

    kwargs = {"frames_per_batch": 18, "start_method": start_method, "credits": 1}
    one_worker = envs()[:1]
    with anyio.fail_after(90):
        trained = probe(0.0)
        async with AsyncBatchedCollector(one_worker, trained, **kwargs) as first:
            await anext(first)
            with torch.no_grad():
                trained.module.w.fill_(1.0)
            assert await first.update_policy_weights_() == 1  # nothing given: the policy it was built with
            state = first.state_dict()
        assert state["policy_version"] == 1
        async with AsyncBatchedCollector(one_worker, probe(0.0), **kwargs) as second:
            second.load_state_dict(state)
            for _ in range(4):  # batches collected ahead, before the restore, may still come
                batch = await anext(second)
                if (batch["collector", "policy_version"] == 1).all():
                    break
            assert (batch["collector", "policy_version"] == 1).all()
            assert batch["action"].eq(1).all()
            assert second.policy_version == 1


async def test_policy_lag_is_measured_from_the_oldest_version_that_acted_in_each_workers_last_batch(
    start_method: str,
) -> None:
    from acollect.testing import WeightProbe

    trained = TensorDictModule(WeightProbe(0.0), in_keys=["observation"], out_keys=["action"])
    last: dict[int, torch.Tensor] = {}
    with anyio.fail_after(90):
        async with AsyncBatchedCollector(envs(), trained, frames_per_batch=18, total_frames=18 * 40, credits=1,
                                         start_method=start_method) as collector:  # fmt: skip
            async for batch in collector:
                last[int(batch["collector", "worker_id"][0, 0])] = batch["collector", "policy_version"].clone()
                if collector.policy_version < 6:
                    await collector.update_policy_weights_()
                # Until each worker's last batch was made by pushed weights only: then its lag is under the version.
                elif len(last) == 2 and all(int(v.min()) > 0 for v in last.values()):
                    break
            else:
                raise AssertionError("no batch of each worker was made by pushed weights only")
            stats = collector.stats()
    assert stats.policy_version == 6
    assert stats.policy_lag == {w: 6 - int(versions.min()) for w, versions in sorted(last.items())}
    assert all(lag < 6 for lag in stats.policy_lag.values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker_ids": [0]}, r"worker_ids.*inference server"),
        ({"model_id": "policy.module"}, r"model_id.*'policy' only"),
        ({"policy": policy(), "weights_dict": {"policy": policy()}}, r"got policy= and weights_dict="),
    ],
    ids=["worker_ids", "model_id", "two-sources"],
)
async def test_what_the_server_cannot_honour_is_refused_before_anything_starts(kwargs: dict, match: str) -> None:
    collector = AsyncBatchedCollector(envs(), policy(), frames_per_batch=18)
    try:
        with pytest.raises(ConfigurationError, match=match):
            await collector.update_policy_weights_(**kwargs)
        assert collector.state is CollectorState.NEW
    finally:
        await collector.async_shutdown()


@pytest.mark.parametrize("frames_per_batch", [18, 8 * 256])  # a small batch sent whole, a large one through slots
async def test_batches_are_named_none_time_as_every_other_collectors(start_method: str, frames_per_batch: int) -> None:
    n_envs = 8 if frames_per_batch > 18 else 3
    make = [functools.partial(CountingEnv, num_envs=n_envs, start=1000 * k) for k in range(2)]
    kwargs = {"frames_per_batch": frames_per_batch, "total_frames": 2 * frames_per_batch, "start_method": start_method}
    with anyio.fail_after(90):
        for cls in (MultiAsyncCollector, AsyncBatchedCollector):
            async with cls(make, policy(), **kwargs) as collector:
                async for batch in collector:
                    assert batch.names == [None, "time"], cls.__name__
                    assert batch["next"].names == [None, "time"], cls.__name__
