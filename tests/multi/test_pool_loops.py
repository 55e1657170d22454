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
from acollect._worker.process import WorkerProcess
from acollect._worker.protocol import WorkerConfig
from acollect.launchers._local import LocalLauncher
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


def blocking_postproc(batch: TensorDictBase) -> TensorDictBase:
    time.sleep(0.3)  # a heavy post-processing step, blocking as real ones are
    return batch


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_combining_and_postproc_run_off_the_event_loop(cls: type, start_method: str) -> None:
    worst = 0.0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(0.01)
            worst = max(worst, time.perf_counter() - t0 - 0.01)

    async with cls([CountingEnv] * 2, frames_per_batch=8, postproc=blocking_postproc, start_method=start_method) as c:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            for _ in range(3):
                await anext(c)
            done.set()
    # On the loop, each batch would stall it 300 ms; in a thread the ticker barely notices.
    assert worst < 0.15, f"the event loop was blocked for {worst * 1000:.0f} ms"
