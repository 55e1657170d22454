"""Failures of worker processes: crashes, restarts, remote exceptions, hangs, and the trainer's own death."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import anyio
import psutil
import pytest
import torch
from multi_helpers import TrajectoryIds
from tensordict import TensorDictBase

from acollect import (
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RemoteError,
    WeightSyncError,
    WorkerCrashedError,
    WorkerTimeoutError,
)
from acollect.testing import (
    CountingEnv,
    CrashingEnv,
    Gate,
    SlowEnv,
    WeightProbe,
    assert_counting_batch,
    wait_until,
)

# Generous deadlines: they bound a hang, they do not measure speed.
NOTICE = 10.0


def slow(step_time: float):
    return lambda: SlowEnv(step_time=step_time, num_envs=2, episode_length=5)


async def test_killed_worker_raises_with_index_and_exit_code(start_method: str) -> None:
    async with MultiSyncCollector([slow(0.01)] * 2, frames_per_batch=400, start_method=start_method) as collector:
        os.kill(collector.worker_pids[1], signal.SIGKILL)
        with anyio.fail_after(NOTICE), pytest.raises(WorkerCrashedError) as info:
            await anext(collector)
    assert info.value.worker_id == 1
    assert info.value.exitcode == -signal.SIGKILL
    assert "SIGKILL" in str(info.value)


async def test_restarted_worker_keeps_going_without_duplicates(start_method: str, tmp_path: Path) -> None:
    # Worker 0 is killed while it is held at a gate mid-way through its part of the second batch, its part of the
    # third asked for ahead already: those two parts are lost (counted), and asked again of its successor.
    steps = 20
    ids = TrajectoryIds()
    with Gate(tmp_path) as gate:
        # Episodes of 7 steps end inside parts: a trajectory runs on from one batch into the next.
        envs = [gate.env(hold_at_step=steps + steps // 2, num_envs=2, episode_length=7),
                functools.partial(CountingEnv, num_envs=2, episode_length=7)]  # fmt: skip
        async with MultiSyncCollector(
            envs, frames_per_batch=2 * 2 * steps, max_worker_restarts=1, start_method=start_method
        ) as collector:
            assert collector.pool is not None
            worker = collector.pool.handles[0]
            batches = [await anext(collector)]

            async def take(n: int) -> None:
                batches.extend([await anext(collector) for _ in range(n)])

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(take, 3)
                    await gate.wait_held()
                    await wait_until(lambda: worker.lockstep.outstanding == 2)  # parts 2 and 3: held and asked ahead
                    dead = collector.worker_pids[0]
                    assert gate.holder == dead
                    os.kill(dead, signal.SIGKILL)
            assert collector.worker_pids[0] != dead
            assert collector.dropped_batches == 2  # the part it was on, and the one asked ahead
            for batch in batches:
                assert batch.batch_size == (2, 2, steps)
                assert_counting_batch(batch)
                ids.feed(batch)  # the restarted worker's first batch is compared with every batch before it too
            # Its successor built its envs afresh, and collected the lost parts anew: worker 1's stream has no gap.
            assert torch.equal(batches[1]["observation"][0, :, 0], batches[0]["observation"][0, :, 0])
            assert_counting_batch(torch.cat([batch[1] for batch in batches], dim=-1))
            # A second death is over the limit: the collector fails (a batch whose parts were in already may come
            # first).
            os.kill(collector.worker_pids[0], signal.SIGKILL)

            async def drain() -> None:
                while True:
                    await anext(collector)

            with anyio.fail_after(NOTICE), pytest.raises(WorkerCrashedError):
                await drain()


async def test_exception_in_worker_env_becomes_remote_error(start_method: str) -> None:
    async with MultiSyncCollector(
        [CountingEnv, lambda: CrashingEnv(crash_at_step=3, exc_type=KeyError)],
        frames_per_batch=20,
        start_method=start_method,
    ) as collector:
        with anyio.fail_after(NOTICE), pytest.raises(RemoteError) as info:
            await anext(collector)
    err = info.value
    assert err.worker_id == 1
    assert err.type_name == "KeyError"
    assert "CrashingEnv crashed at step 3" in err.remote_traceback
    assert "_before_step" in err.remote_traceback  # the worker's own frames
    assert "Remote traceback (worker 1)" in str(err)


def assert_no_internal_cancellation(err: BaseException) -> None:
    """``err``'s chain and its printed traceback hold no cancellation of the collector's own."""
    seen = err.__cause__ or err.__context__
    while seen is not None:
        assert not isinstance(seen, (anyio.get_cancelled_exc_class(), KeyboardInterrupt)), repr(seen)
        seen = seen.__cause__ or seen.__context__
    text = "".join(traceback.format_exception(err))
    assert "CancelledError" not in text, text
    assert "Cancelled via cancel scope" not in text, text
    assert "During handling of the above exception" not in text, text


def writes_actions(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that writes its choice under ``"actions"``, not ``"action"``."""
    return td.set("actions", torch.zeros(td.batch_size[0], dtype=torch.long))


@pytest.mark.parametrize("when", ["entry", "batch"])
async def test_a_worker_error_is_raised_without_the_collectors_internal_cancellation(
    start_method: str, when: str
) -> None:
    # A worker's failure cancels the call that waits for it; the error the user reads must not be
    # chained to that cancellation (a page of anyio frames before the worker's own message).
    if when == "entry":  # refused as the worker builds the policy: `async with` raises
        envs, policy, match = [lambda: GymEnv("CartPole-v1", num_envs=2)] * 2, writes_actions, "did not write 'action'"
    else:  # an env raising mid-batch: the batch's `anext` raises
        envs, policy, match = [CountingEnv, lambda: CrashingEnv(crash_at_step=3)], None, "crashed at step 3"
    with anyio.fail_after(60), pytest.raises(RemoteError, match=match) as info:
        async with MultiSyncCollector(envs, policy, frames_per_batch=16, start_method=start_method) as collector:
            await anext(collector)
    assert_no_internal_cancellation(info.value)


async def test_exception_while_building_the_env_is_a_remote_error(start_method: str) -> None:
    def broken() -> CountingEnv:
        raise ValueError("no such level")

    collector = MultiSyncCollector([CountingEnv, broken], frames_per_batch=8, start_method=start_method)
    with anyio.fail_after(NOTICE), pytest.raises(RemoteError, match="no such level") as info:
        async with collector:
            pass
    assert info.value.type_name == "ValueError"
    assert info.value.worker_id == 1
    # `broken` crossed to the worker by value; its frame names this file, not cloudpickle's "<dynamic-code>".
    assert f'File "{__file__}", line ' in info.value.remote_traceback
    assert 'raise ValueError("no such level")' in info.value.remote_traceback


async def test_hung_worker_raises_timeout(start_method: str) -> None:
    async with MultiSyncCollector(
        [CountingEnv, slow(3600)], frames_per_batch=8, heartbeat_timeout=1.0, start_method=start_method
    ) as collector:
        with anyio.fail_after(NOTICE + 1.0), pytest.raises(WorkerTimeoutError, match="hung") as info:
            await anext(collector)
    assert info.value.worker_id == 1


async def test_weight_push_to_a_dead_worker_names_it(start_method: str) -> None:
    async with MultiSyncCollector(
        [CountingEnv] * 2, WeightProbe(), frames_per_batch=8, start_method=start_method
    ) as collector:
        await anext(collector)
        os.kill(collector.worker_pids[1], signal.SIGKILL)
        with anyio.fail_after(NOTICE), pytest.raises(WeightSyncError) as info:
            await collector.update_policy_weights_(WeightProbe(1.0), timeout=5.0)
    assert info.value.worker_ids == (1,)


async def test_async_collector_reports_a_crash(start_method: str) -> None:
    async with MultiAsyncCollector([slow(0.01)] * 2, frames_per_batch=400, start_method=start_method) as collector:
        os.kill(collector.worker_pids[0], signal.SIGKILL)
        with anyio.fail_after(NOTICE), pytest.raises(WorkerCrashedError) as info:
            async for _ in collector:
                pass
    assert info.value.worker_id == 0


async def test_shutdown_mid_collection_is_bounded(start_method: str) -> None:
    collector = MultiAsyncCollector([slow(0.001)] * 2, frames_per_batch=10_000, start_method=start_method)
    async with collector:
        await anyio.sleep(0.2)  # both workers are mid-batch
        with anyio.fail_after(NOTICE):
            await collector.async_shutdown(timeout=2.0)


TRAINER = textwrap.dedent(
    """
    import anyio, sys
    from acollect import MultiSyncCollector
    from acollect.testing import SlowEnv

    async def main():
        async with MultiSyncCollector(
            [lambda: SlowEnv(step_time=0.01)] * 2, frames_per_batch=10_000, start_method=sys.argv[1]
        ) as collector:
            print(*collector.worker_pids, flush=True)
            await anext(collector)

    anyio.run(main)
    """
)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_exit_when_the_trainer_is_killed(method: str, tmp_path: Path) -> None:
    # The trainer's temp dir is watched: a killed trainer runs no exit hook, so whatever it left there stays
    # (multiprocessing's fork server listener did: a pymp-* directory in the temp dir, for good).
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, method],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path)},
    )
    try:
        assert trainer.stdout is not None
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 2
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=NOTICE)
        if trainer.stdout is not None:
            trainer.stdout.close()
    deadline = time.monotonic() + NOTICE
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    assert not alive, f"workers {alive} outlived their trainer"
    # The fork server exits once its trainer is gone, and takes its listener with it.
    left = list(tmp_path.glob("pymp-*"))
    while left and time.monotonic() < deadline + NOTICE:
        time.sleep(0.05)
        left = list(tmp_path.glob("pymp-*"))
    assert not left, f"the killed trainer left {[(p.name, [c.name for c in p.iterdir()]) for p in left]}"
