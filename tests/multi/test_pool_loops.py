"""The pool's background loops: a loop that fails breaks the collector, and the event loop never waits.

A bare task that dies silently is how dead workers stop being noticed: here the liveness loop
fails while restarting a worker (the launcher raises ``OSError``), and the collector must say so
at the next call, as BROKEN, instead of waiting forever for a worker nobody restarts.
"""

from __future__ import annotations

import os
import signal
import time

import anyio
import pytest
from tensordict import TensorDictBase

from acollect import CollectorState, MultiAsyncCollector, MultiSyncCollector
from acollect._workers.local_launcher import LocalLauncher
from acollect._workers.process import WorkerProcess
from acollect._workers.protocol import WorkerConfig
from acollect.testing import CountingEnv, SlowEnv

NOTICE = 10.0


class LaunchOnceLauncher(LocalLauncher):
    """A local launcher that can start each worker once: a restart fails as a full process table would."""

    def start(self, config: WorkerConfig) -> WorkerProcess:
        if config.generation > 1:
            raise OSError(11, f"cannot start worker {config.index} again (resource temporarily unavailable)")
        return super().start(config)


def slow_env() -> SlowEnv:
    return SlowEnv(step_time=0.01, num_envs=2)


async def test_a_failing_liveness_loop_breaks_the_collector(start_method: str) -> None:
    collector = MultiSyncCollector(
        [slow_env] * 2, frames_per_batch=40, max_worker_restarts=3, launcher=LaunchOnceLauncher(start_method)
    )
    async with collector:
        await anext(collector)
        os.kill(collector.worker_pids[0], signal.SIGKILL)
        with anyio.fail_after(NOTICE), pytest.raises(OSError, match="cannot start worker 0 again"):
            await anext(collector)
        assert collector.state is CollectorState.BROKEN
        with pytest.raises(OSError, match="cannot start worker 0 again"):
            await anext(collector)  # sticky until shutdown
    assert collector.state is CollectorState.CLOSED


#: Ticks of a task on the trainer's event loop, counted while the post-processing waits for them.
TICKS = [0]


def waits_for_the_loop(batch: TensorDictBase) -> TensorDictBase:
    """A post-processing step that blocks, as real ones do, until a task on the trainer's event loop has run since it
    began: on the loop itself it would wait for a tick that never comes."""
    seen, deadline = TICKS[0], time.monotonic() + 20
    while TICKS[0] == seen:
        if time.monotonic() > deadline:
            raise TimeoutError("no task of the event loop ran for 20 s while a batch was post-processed")
        time.sleep(0.001)
    return batch


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_combining_and_postproc_run_off_the_event_loop(cls: type, start_method: str) -> None:
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            await anyio.sleep(0.001)
            TICKS[0] += 1

    async with cls([CountingEnv] * 2, frames_per_batch=8, postproc=waits_for_the_loop, start_method=start_method) as c:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                batches = [await anext(c) for _ in range(3)]
                done.set()
    assert len(batches) == 3
