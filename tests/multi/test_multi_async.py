"""MultiAsyncCollector and AsyncCollector: first-ready order, tags, credits (bounded memory), pause, background."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import psutil
import pytest
import torch
from multi_helpers import ActsSeven, report_threads

from acollect import AsyncCollector, ConfigurationError, GymEnv, MultiAsyncCollector, RemoteError, ReplayBuffer
from acollect.testing import CountingEnv, Gate, PixelEnv, SlowEnv, WeightProbe, assert_counting_batch


async def test_first_ready_first_served_and_tagged(start_method: str) -> None:
    # Worker 0 needs hours per batch; worker 1 none: everything comes from worker 1, nobody waits.
    async with MultiAsyncCollector(
        [lambda: SlowEnv(step_time=3600), lambda: CountingEnv(num_envs=2, start=10**6)],
        frames_per_batch=4,
        total_frames=24,
        start_method=start_method,
        heartbeat_timeout=3600,
    ) as collector:
        with anyio.fail_after(30):
            batches = [batch async for batch in collector]
    assert len(batches) == 6
    for batch in batches:
        assert batch.batch_size == (2, 2)
        assert batch["collector", "worker_id"].eq(1).all()
        assert (batch["observation"] >= 10**6).all()
        assert_counting_batch(batch)
    assert (batches[-1]["observation"] > batches[0]["observation"]).all()  # in order, none repeated


async def test_workers_run_with_one_torch_thread(start_method: str) -> None:
    async with AsyncCollector(CountingEnv, report_threads, frames_per_batch=4, start_method=start_method) as collector:
        batch = await anext(collector)
    assert batch.batch_size == (1, 4)
    assert batch["threads"].eq(1).all()


async def test_slow_consumer_keeps_memory_bounded(start_method: str) -> None:
    # Each batch is ~7 MB; unthrottled, the workers would fill gigabytes while the consumer sleeps.
    frames = 8 * 16
    async with MultiAsyncCollector(
        [lambda: PixelEnv(num_envs=8)] * 2, frames_per_batch=frames, credits=2, start_method=start_method
    ) as collector:
        await anext(collector)
        rss = psutil.Process().memory_info().rss
        for _ in range(6):
            batch = await anext(collector)
            await anyio.sleep(0.3)
        growth = psutil.Process().memory_info().rss - rss
        seen = collector.state_dict()["workers"]
    assert batch["pixels"].shape == (8, 16, 84, 84, 4)
    batch_bytes = 2 * batch["pixels"].numel()
    assert growth < 10 * batch_bytes, f"main process grew by {growth / 1e6:.0f} MB"
    # no worker got more than its credits ahead of what was consumed
    assert sum(w["frames"] for w in seen) <= (7 + 2 * 2) * frames


async def test_pause_stops_background_collection(start_method: str) -> None:
    buffer = ReplayBuffer(100_000)
    async with MultiAsyncCollector(
        [lambda: SlowEnv(step_time=0.001, num_envs=2)] * 2, frames_per_batch=8, start_method=start_method
    ) as collector:
        collector.start(replay_buffer=buffer)
        with anyio.fail_after(30):
            while len(buffer) < 32:  # noqa: ASYNC110 - a buffer has no event to wait on
                await anyio.sleep(0.01)
        async with collector.pause():
            size = len(buffer)
            await anyio.sleep(0.5)
            assert len(buffer) == size
        with anyio.fail_after(30):
            while len(buffer) <= size:  # noqa: ASYNC110
                await anyio.sleep(0.01)


async def test_async_collector_weights_apply_at_a_batch_boundary(start_method: str) -> None:
    async with AsyncCollector(
        lambda: CountingEnv(num_envs=2), WeightProbe(0.0), frames_per_batch=8, start_method=start_method
    ) as collector:
        await anext(collector)
        await collector.update_policy_weights_(WeightProbe(1.0))
        for _ in range(6):
            batch = await anext(collector)
            version = batch["collector", "policy_version"]
            # one version per batch, and the actions are that version's
            assert version.unique().numel() == 1
            assert batch["action"].eq(int(version[0, 0])).all()
        assert int(version[0, 0]) == 1
    assert torch.is_tensor(batch["collector", "worker_id"])


async def test_pushes_queued_while_a_worker_is_mid_batch_apply_in_order(start_method: str, tmp_path: Path) -> None:
    # Worker 0 is held at a gate mid-way through its second batch while three pushes queue up in it; worker 1 takes
    # them as they come. Each push's action is its version: a frame stamped with one version and acting with an older
    # push's weights shows.
    steps = 10
    with Gate(tmp_path) as gate:
        envs = [gate.env(hold_at_step=steps + steps // 2, num_envs=2, n_actions=8),
                functools.partial(CountingEnv, num_envs=2, start=10**5, n_actions=8)]  # fmt: skip
        async with MultiAsyncCollector(
            envs, WeightProbe(0.0, high=7), frames_per_batch=2 * steps, start_method=start_method
        ) as collector:
            versions: dict[int, list[int]] = {0: [], 1: []}
            with anyio.fail_after(60):
                await gate.wait_held()
                for version in (1, 2, 3):
                    assert await collector.update_policy_weights_(WeightProbe(float(version))) == version
                gate.open()
                while len(versions[0]) < 4 or versions[1][-1:] != [3]:
                    batch = await anext(collector)
                    stamped = batch["collector", "policy_version"]
                    assert torch.equal(batch["action"], stamped), "a frame acted with other weights"
                    assert_counting_batch(batch)
                    assert stamped.unique().numel() == 1, "a batch mixes versions"
                    versions[int(batch["collector", "worker_id"][0, 0])].append(int(stamped[0, 0]))
    # Worker 0's batch under way kept the weights that began it; the next one acts with the last push's.
    assert versions[0][:2] == [0, 0]
    assert set(versions[0][2:]) == {3}
    assert versions[1] == sorted(versions[1])


def test_an_unregistered_gym_id_is_refused_at_construction() -> None:
    for cls in (MultiAsyncCollector, AsyncCollector):
        with pytest.raises(ConfigurationError, match="did you mean 'CartPole-v1'"):
            cls(functools.partial(GymEnv, "CartPol-v1"), frames_per_batch=8)


async def test_a_policy_refused_in_the_worker_fails_entry(start_method: str) -> None:
    collector = MultiAsyncCollector("CartPole-v1", ActsSeven(), num_workers=2, frames_per_batch=8,
                                    start_method=start_method)  # fmt: skip
    with anyio.fail_after(60), pytest.raises(RemoteError, match="outside the action space") as info:
        await collector.__aenter__()
    assert info.value.type_name.rsplit(".", 1)[-1] == "PolicyError"


async def test_frames_per_batch_rounded_once_and_the_attribute_tells_the_truth(start_method: str) -> None:
    with pytest.warns(UserWarning, match=r"\(3 per worker\): each batch holds 102 frames") as w:
        collector = MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=100,
                                        env_kwargs={"num_envs": 3}, start_method=start_method)  # fmt: skip
    assert [x.filename for x in w] == [__file__]
    assert collector.frames_per_batch == 102
    async with collector:
        batch = await anext(collector)
    assert batch.numel() == 102
    late = MultiAsyncCollector([lambda: CountingEnv(num_envs=3)] * 2, frames_per_batch=100, start_method=start_method)
    with pytest.warns(UserWarning, match="each batch holds 102 frames") as w:
        async with late:
            batch = await anext(late)
    assert [x.filename for x in w] == [__file__]
    assert late.frames_per_batch == batch.numel() == 102
