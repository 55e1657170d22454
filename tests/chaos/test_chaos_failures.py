"""Chaos: an env that raises, an env that hangs, and a weight push to a dead worker."""

from __future__ import annotations

import functools
import os
import signal
import time

import anyio
import pytest
from chaos_helpers import NOTICE, Ledger, LedgerEnv, LedgerPolicy, StepLimitError

from acollect import (
    MultiAsyncCollector,
    MultiSyncCollector,
    RemoteError,
    WeightSyncError,
    WorkerTimeoutError,
)
from acollect.testing import CrashingEnv


@pytest.mark.parametrize("collector_cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_an_env_that_raises_is_a_remote_error_and_the_others_stop_cleanly(
    start_method: str, ledger: Ledger, collector_cls: type[MultiSyncCollector]
) -> None:
    healthy = functools.partial(LedgerEnv, str(ledger.path), num_envs=2)
    crashing = functools.partial(CrashingEnv, 25, 2, StepLimitError)
    collector = collector_cls([healthy, crashing, healthy], frames_per_batch=60, start_method=start_method)
    batches = 0

    async def consume() -> None:
        nonlocal batches
        async for _ in collector:
            batches += 1

    async with collector:
        pids = list(collector.worker_pids)
        with anyio.fail_after(NOTICE), pytest.raises(RemoteError) as info:
            await consume()
    error = info.value
    assert error.worker_id == 1
    assert error.type_name.endswith("StepLimitError")
    assert "CrashingEnv crashed at step 25" in error.remote_traceback
    assert "_before_step" in error.remote_traceback  # the worker's own frames, not the trainer's
    assert "Traceback (most recent call last)" in error.remote_traceback
    if collector_cls is MultiSyncCollector:
        # 10 steps per batch: step 25 is in the third, whose error replaced it, or replaced the second where the
        # crashing worker ran ahead into its part of the third while the others finished the second.
        assert batches in (1, 2)

    # The healthy workers were asked to stop and closed their envs: no SIGKILL was needed.
    for pid in (pids[0], pids[2]):
        assert pid is not None
        assert ledger.closed(pid), f"worker pid {pid} did not shut down gracefully"


@pytest.mark.parametrize("collector_cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_a_hung_env_is_reported_after_heartbeat_timeout_and_shutdown_keeps_its_deadline(
    start_method: str, ledger: Ledger, collector_cls: type[MultiSyncCollector]
) -> None:
    heartbeat_timeout, shutdown_timeout = 1.0, 2.0
    healthy = functools.partial(LedgerEnv, str(ledger.path), num_envs=2)
    stuck = functools.partial(LedgerEnv, str(ledger.path), num_envs=2, step_time=float("inf"))
    collector = collector_cls(
        [healthy, stuck],
        frames_per_batch=40,
        heartbeat_timeout=heartbeat_timeout,
        shutdown_timeout=shutdown_timeout,
        start_method=start_method,
    )
    async with collector:
        started = time.monotonic()
        with anyio.fail_after(heartbeat_timeout + NOTICE), pytest.raises(WorkerTimeoutError, match="hung") as info:
            async for _ in collector:
                pass
        reported = time.monotonic() - started
        pids = list(collector.worker_pids)
        # Shutting down a collector whose worker is stuck in C code or a sleep still keeps its deadline.
        with anyio.fail_after(shutdown_timeout + 2.0):
            await collector.async_shutdown()
    assert info.value.worker_id == 1
    assert f"heartbeat_timeout={heartbeat_timeout}s" in str(info.value)
    assert reported >= heartbeat_timeout  # not reported hung before its time
    assert pids[0] is not None
    assert ledger.closed(pids[0])  # the healthy worker stopped gracefully


async def test_a_weight_push_to_a_dead_worker_names_it_and_the_others_get_the_weights(
    start_method: str, ledger: Ledger
) -> None:
    env = functools.partial(LedgerEnv, str(ledger.path), num_envs=2)
    timeout = 3.0
    collector = MultiSyncCollector([env] * 3, LedgerPolicy(0.0), frames_per_batch=30, start_method=start_method)
    async with collector:
        first = await anext(collector)
        assert int(first["action"].max()) == 0
        pids = list(collector.worker_pids)
        assert pids[1] is not None
        os.kill(pids[1], signal.SIGKILL)
        with anyio.fail_after(timeout + NOTICE), pytest.raises(WeightSyncError) as info:
            await collector.update_policy_weights_(LedgerPolicy(1.0), timeout=timeout)
    assert info.value.worker_ids == (1,)
    assert "[1]" in str(info.value)
    # Inside the live workers: each held the new weights when it shut down.
    assert [ledger.weight(pid) for pid in pids if pid is not None] == [1.0, None, 1.0]
