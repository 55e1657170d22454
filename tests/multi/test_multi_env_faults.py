"""Env faults survived inside worker processes (``env_errors="restart"``): the worker stays, its env is rebuilt.

The envs raise at a chosen step of their life (:class:`~acollect.testing.CrashingGymEnv`,
:class:`~acollect.testing.CrashingEnv`): a rebuilt env raises again at the same step of its own life, so with a
crash at step ``k`` each life takes ``k - 1`` good steps, and the frames show exactly where each rebuild was.
"""

from __future__ import annotations

import functools

import anyio
import pytest
import torch

from acollect import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector, RemoteError
from acollect.envs import AsyncEnvPool, GymEnv
from acollect.testing import (
    ENV_STRIDE,
    AsyncCountingEnv,
    CrashingEnv,
    CrashingGymEnv,
    WeightProbe,
    assert_counting_batch,
)

DEADLINE = 60.0


async def test_a_worker_rebuilds_its_gymnasium_env_and_keeps_its_process(start_method: str) -> None:
    make = functools.partial(GymEnv, functools.partial(CrashingGymEnv, 7, episode_length=5), num_envs=2)
    collector = MultiAsyncCollector(
        [make], frames_per_batch=20, total_frames=60, env_errors="restart", start_method=start_method
    )
    with anyio.fail_after(DEADLINE):
        async with collector:
            pids = list(collector.worker_pids)
            batches = []
            async for batch in collector:
                batches.append(batch.clone())
                assert collector.worker_pids == pids  # the same process all along
            stats = collector.stats()
    stream = torch.cat(batches, dim=1)
    obs = stream["observation"].squeeze(-1)
    # 30 batched steps: each sub-env counts from 0, so a rebuilt env shows as every row back at 0
    starts = [t for t in range(1, stream.batch_size[1]) if bool((obs[:, t] == 0).all())]
    assert starts == [6, 12, 18, 24]
    assert stats.env_restarts >= len(starts)  # counted with each batch (a heartbeat may tell of one ahead)
    assert stats.restarts == 0
    truncated, done = stream["next", "truncated"].squeeze(-1), stream["next", "done"].squeeze(-1)
    assert truncated.sum() == 2 * len(starts)
    for t in starts:
        assert truncated[:, t - 1].all()
        assert done[:, t - 1].all()
    ids = stream["collector", "traj_ids"]
    for t in starts:
        assert (ids[:, t] > ids[:, :t].max()).all()  # the frames after it start new trajectories
    for lo, hi in zip([0, *starts], [*starts, stream.batch_size[1]], strict=False):
        assert_counting_batch(stream[:, lo:hi])


async def test_a_worker_env_that_raises_before_its_first_step_each_time_is_a_remote_error(start_method: str) -> None:
    make = functools.partial(GymEnv, functools.partial(CrashingGymEnv, 1), num_envs=2)
    collector = MultiAsyncCollector([make], frames_per_batch=20, env_errors="restart", start_method=start_method)
    with anyio.fail_after(DEADLINE), pytest.raises(RemoteError) as info:
        async with collector:
            await anext(collector)
    error = info.value
    assert error.type_name == "RuntimeError"
    assert "CrashingGymEnv crashed at step 1 of its life" in str(error)
    assert "Traceback (most recent call last)" in error.remote_traceback
    assert "in step" in error.remote_traceback  # the env's own frame


async def test_a_worker_env_whose_factory_fails_on_rebuild_is_a_remote_error_with_that_error(
    start_method: str,
) -> None:
    built: list[int] = []  # the worker's own copy

    def make() -> CrashingEnv:
        built.append(1)
        if len(built) > 1:
            raise OSError("the simulator's licence server is gone")
        return CrashingEnv(4, 2)

    collector = MultiSyncCollector([make], frames_per_batch=20, env_errors="restart", start_method=start_method)
    with anyio.fail_after(DEADLINE), pytest.raises(RemoteError, match="licence server is gone") as info:
        async with collector:
            await anext(collector)
    assert info.value.type_name == "OSError"
    assert "in make" in info.value.remote_traceback


async def test_a_worker_env_error_still_breaks_the_collector_by_default(start_method: str) -> None:
    collector = MultiAsyncCollector(
        [functools.partial(CrashingEnv, 3, 2)], frames_per_batch=20, start_method=start_method
    )
    with anyio.fail_after(DEADLINE), pytest.raises(RemoteError, match="CrashingEnv crashed at step 3") as info:
        async with collector:
            await anext(collector)
    assert info.value.type_name == "RuntimeError"


async def test_env_groups_of_central_inference_each_rebuild_their_own_env(start_method: str) -> None:
    # 4 envs in 2 groups of 2, each group an env of its own built from the factory; 10 steps a batch
    collector = AsyncBatchedCollector(
        [functools.partial(CrashingEnv, 7)], WeightProbe(0.0), frames_per_batch=40, total_frames=40,
        env_kwargs={"num_envs": 4}, env_groups=2, env_errors="restart", start_method=start_method,
    )  # fmt: skip
    with anyio.fail_after(DEADLINE):
        async with collector:
            batch = (await anext(collector)).clone()
            restarts = collector.stats().env_restarts
    assert restarts >= 2  # each group's env raised at its 7th step
    obs = batch["observation"].squeeze(-1)
    # each group's rebuilt env starts again from its first observation: rows 0, 1 of each group at 0 and ENV_STRIDE
    assert obs[:, 6].tolist() == [0.0, ENV_STRIDE, 0.0, ENV_STRIDE]
    assert batch["next", "truncated"].squeeze(-1)[:, 5].all()
    assert batch["next", "truncated"].sum() == 4
    assert_counting_batch(batch[:, :6])
    assert_counting_batch(batch[:, 6:])


async def test_a_worker_rebuilds_each_coroutine_env_of_its_pool_alone(start_method: str) -> None:
    env = functools.partial(AsyncCountingEnv, 5, crash_at_step=7)
    pool = functools.partial(AsyncEnvPool, env, 2)
    collector = MultiAsyncCollector(
        [pool], frames_per_batch=40, total_frames=40, env_errors="restart", start_method=start_method
    )
    with anyio.fail_after(DEADLINE):
        async with collector:
            pids = list(collector.worker_pids)
            batch = (await anext(collector)).clone()
            assert collector.worker_pids == pids
            assert collector.stats().env_restarts >= 2 * 3  # 20 steps per env: lives of 6 steps
    truncated, terminated = batch["next", "truncated"].squeeze(-1), batch["next", "terminated"].squeeze(-1)
    assert (truncated & ~terminated).sum(dim=1).tolist() == [3, 3]
    obs = batch["observation"].squeeze(-1)
    assert (obs[:, [6, 12, 18]] == 0).all()  # a rebuilt env's first step, from its reset
