"""Chaos: SIGKILL random workers at random moments, and account for every frame.

The envs are counting envs whose workers keep a ledger of the steps they took (see ``chaos_helpers``),
so the test knows what each killed worker collected and compares it with what the collector handed
out: nothing is duplicated, nothing is missing inside what a worker delivered, and the only frames lost
are those of the parts in flight at each kill (running ahead, a worker may hold two: the one it sent,
whose message dies with it in its socket's queue, and the next one it began), which the collector
counts in ``dropped_batches``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import time
from dataclasses import dataclass

import anyio
import anyio.lowlevel
import pytest
from chaos_helpers import NOTICE, Ledger, LedgerEnv, StreamChecker, env_int

from acollect import MultiSyncCollector, WorkerCrashedError
from acollect.testing import wait_until

N_WORKERS, N_ENVS, T = 2, 2, 25
KILLS = env_int("ACOLLECT_CHAOS_KILLS", 50)


@dataclass
class Kill:
    worker: int
    pid: int
    mid_batch: bool  # the trainer was waiting for a batch when the kill came
    dropped: int  # what dropped_batches grew by
    notice_s: float  # until the restart was counted


def ledger_env(ledger: Ledger, step_time: float = 0.0005) -> functools.partial[LedgerEnv]:
    return functools.partial(LedgerEnv, str(ledger.path), step_time=step_time, num_envs=N_ENVS, episode_length=7)


async def test_random_kills_with_restarts_lose_only_the_batches_in_flight(
    start_method: str, ledger: Ledger, rng: random.Random
) -> None:
    checker = StreamChecker()
    pids: dict[int, list[int]] = {w: [] for w in range(N_WORKERS)}
    kills: list[Kill] = []
    collector = MultiSyncCollector(
        [ledger_env(ledger)] * N_WORKERS,
        frames_per_batch=N_WORKERS * N_ENVS * T,
        max_worker_restarts=KILLS,
        start_method=start_method,
    )
    async with collector:

        async def take() -> None:
            batch = await anext(collector)
            for w in range(N_WORKERS):
                checker.feed(w, batch[w])

        for w, pid in enumerate(collector.worker_pids):
            assert pid is not None
            pids[w].append(pid)
        await take()
        for k in range(KILLS):
            w = rng.randrange(N_WORKERS)
            victim = collector.worker_pids[w]
            assert victim is not None
            before = collector.dropped_batches
            mid = rng.random() < 0.7
            killed_at = time.monotonic()
            if mid:  # while the trainer waits for a batch: some time into it, up to about one batch
                killed_at += rng.uniform(0, 0.015)
                asyncio.get_running_loop().call_at(killed_at - time.monotonic() + asyncio.get_running_loop().time(),
                                                   os.kill, victim, signal.SIGKILL)  # fmt: skip
                with anyio.fail_after(NOTICE + 5):
                    await take()
            else:
                os.kill(victim, signal.SIGKILL)
            # Each kill is counted as a restart: the trainer never waits on a dead worker.
            await wait_until(
                lambda: collector.stats().restarts >= k + 1 and collector.worker_pids[w] not in (victim, None),  # noqa: B023
                timeout=NOTICE,
                interval=0.005,
            )
            notice = time.monotonic() - killed_at
            kills.append(Kill(w, victim, mid, collector.dropped_batches - before, notice))
            new_pid = collector.worker_pids[w]
            assert new_pid is not None
            pids[w].append(new_pid)
            # Every incarnation delivers a part: at the latest in the second batch after its start (the first may
            # still hold the part its predecessor collected ahead while the other worker finished its own).
            for _ in range(2):
                with anyio.fail_after(NOTICE):
                    await take()
        dropped = collector.dropped_batches
        assert collector.stats().restarts == KILLS

    # Every kill restarted its worker: one incarnation per process, each gap-free from its env's first step.
    for w in range(N_WORKERS):
        assert len(checker.streams[w]) == len(pids[w]), f"worker {w}: incarnations do not match its processes"
    # Frames lost are the frames a killed worker collected and never delivered: at most the parts it was asked
    # for (two where it ran ahead), each counted as a dropped batch.
    by_pid = {(k.worker, k.pid): k for k in kills}
    for w in range(N_WORKERS):
        for pid, incarnation in zip(pids[w], checker.streams[w], strict=True):
            taken = ledger.steps(pid)
            lost = taken - incarnation.steps
            kill = by_pid.get((w, pid))
            if kill is None:  # still running at the end: shut down gracefully, losing at most the batch begun ahead
                assert 0 <= lost <= T, f"worker {w} (pid {pid}) collected {lost} steps it never delivered"
                assert ledger.closed(pid)
                continue
            assert 0 <= lost <= 2 * T, f"worker {w} (pid {pid}) lost {lost} steps, more than two parts in flight"
            assert kill.dropped >= -(-lost // T), f"{lost} steps lost but {kill.dropped} parts counted: {kill}"
            assert kill.dropped <= 2
    assert dropped == sum(k.dropped for k in kills)
    print(
        f"\n{KILLS} kills ({sum(k.mid_batch for k in kills)} mid-batch), {dropped} batches dropped, "
        f"restart counted within {max(k.notice_s for k in kills):.2f}s at most"
    )


@pytest.mark.parametrize("mid_batch", [True, False])
async def test_a_kill_without_restarts_raises_with_index_and_exit_code(
    start_method: str, ledger: Ledger, rng: random.Random, mid_batch: bool
) -> None:
    collector = MultiSyncCollector(
        [ledger_env(ledger, 0.002)] * N_WORKERS, frames_per_batch=N_WORKERS * N_ENVS * T, start_method=start_method
    )
    async with collector:
        await anext(collector)
        w = rng.randrange(N_WORKERS)
        pids = list(collector.worker_pids)
        victim = pids[w]
        assert victim is not None
        if mid_batch:  # while the trainer waits for the batch
            asyncio.get_running_loop().call_later(rng.uniform(0, 0.04), os.kill, victim, signal.SIGKILL)
        else:
            os.kill(victim, signal.SIGKILL)
        with anyio.fail_after(NOTICE), pytest.raises(WorkerCrashedError) as info:
            await anext(collector)
    error = info.value
    assert error.worker_id == w
    assert error.exitcode == -signal.SIGKILL
    assert f"worker {w}" in str(error)
    assert "SIGKILL" in str(error)
    # The other worker was stopped, not killed: it closed its env on the way out.
    assert all(ledger.closed(pid) for i, pid in enumerate(pids) if i != w and pid is not None)
    assert not ledger.closed(victim)


OPERATIONS = ("batch", "pause", "seed", "weights")


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_messages_to_a_worker_killed_a_moment_ago_never_reach_the_trainer(
    start_method: str, ledger: Ledger, rng: random.Random, kind: str
) -> None:
    # A send to a worker whose socket is gone (it was SIGKILLed a moment ago, and its exit code is not
    # known yet) is that worker's death: restarted as the options say, never an error for the caller.
    # Each kind of message is sent right after a kill, over and over, while the death is being noticed.
    from acollect import MultiAsyncCollector
    from acollect.testing import WeightProbe

    cls = MultiSyncCollector if kind == "sync" else MultiAsyncCollector
    collector = cls(
        [ledger_env(ledger, 0.0002)] * N_WORKERS,
        WeightProbe(0.0),
        frames_per_batch=N_WORKERS * N_ENVS * T,
        max_worker_restarts=100,
        start_method=start_method,
    )
    kills = 0
    async with collector:
        await anext(collector)
        for operation in OPERATIONS * 2:
            w = rng.randrange(N_WORKERS)
            victim = collector.worker_pids[w]
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            kills += 1
            with anyio.fail_after(NOTICE + 30):
                for i in range(25):
                    if operation == "batch":
                        await anext(collector)  # requests (lockstep) and credits (first ready) to every worker
                    elif operation == "pause":
                        async with collector.pause():
                            await anyio.lowlevel.checkpoint()
                    elif operation == "seed":
                        collector.set_seed(i)
                        await anext(collector)
                    else:
                        await collector.update_policy_weights_(WeightProbe(float(i % 2)), timeout=30.0)
                    if collector.stats().restarts >= kills and collector.worker_pids[w] not in (victim, None):
                        break
                    await anyio.sleep(0.002)
            await wait_until(
                lambda: collector.stats().restarts >= kills and None not in collector.worker_pids,  # noqa: B023
                timeout=NOTICE,
            )
            with anyio.fail_after(NOTICE + 30):
                await anext(collector)  # and collection goes on
        assert collector.stats().restarts == kills


@pytest.mark.parametrize("change", ["seed", "state"])
async def test_a_seed_or_state_while_a_worker_restarts_does_not_restart_its_successor(
    start_method: str, ledger: Ledger, change: str
) -> None:
    # A successor that has not said hello is not connected: a seed or state sent to it then would fail, and a
    # failed send reads as the worker's death, restarting a healthy process a second later.
    from acollect import MultiAsyncCollector
    from acollect._workers.liveness import UNREACHABLE_GRACE

    collector = MultiAsyncCollector(
        [ledger_env(ledger, 0.0002)] * N_WORKERS,
        frames_per_batch=N_ENVS * T,
        max_worker_restarts=3,
        start_method=start_method,
    )
    async with collector:
        await anext(collector)
        state = collector.state_dict()
        victim = collector.worker_pids[0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        pool = collector.pool
        assert pool is not None
        handle = pool.handles[0]
        # The successor is launched and not connected yet: that is when the change goes out.
        await wait_until(lambda: collector.stats().restarts == 1 and handle.process is not None, timeout=NOTICE,
                         interval=0.001)  # fmt: skip
        assert not handle.ready
        if change == "seed":
            collector.set_seed(7)
        else:
            collector.load_state_dict(state)
        with anyio.fail_after(NOTICE + 30):
            await anext(collector)
        await anyio.sleep(UNREACHABLE_GRACE + 0.5)  # past the grace a failed send would have been given
        with anyio.fail_after(NOTICE + 30):
            for _ in range(3):
                await anext(collector)
        assert collector.stats().restarts == 1
        assert handle.unreachable_since is None
