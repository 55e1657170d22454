"""Chaos on the trainer's side: a trainer killed outright, and a trainer too slow for its workers."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import psutil
import torch
from chaos_helpers import NOTICE, Ledger, LedgerEnv, LedgerPolicy, StreamChecker

from acollect import MultiAsyncCollector
from acollect.testing import our_segments

TRAINER = textwrap.dedent(
    """
    import functools, os, sys
    import anyio
    from chaos_helpers import LedgerEnv, LedgerPolicy
    from acollect import MultiAsyncCollector

    async def main():
        env = functools.partial(LedgerEnv, sys.argv[2], num_envs=4, step_time=0.001)
        collector = MultiAsyncCollector(
            [env] * 2, LedgerPolicy(0.0), frames_per_batch=64, use_shared_memory=True, start_method=sys.argv[1]
        )
        async with collector:
            await anext(collector)
            await collector.update_policy_weights_(LedgerPolicy(1.0))  # weights through a segment too
            address = collector.endpoint_address
            print(os.getpid(), address, *collector.worker_pids, flush=True)
            async for _ in collector:
                await anyio.sleep(0.01)

    anyio.run(main)
    """
)


def test_killing_the_trainer_ends_its_workers_and_frees_its_shared_memory(start_method: str, ledger: Ledger) -> None:
    # (tests/multi checks that spawned workers exit too; what frees the memory does not depend on the method)
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, start_method, str(ledger.path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert trainer.stdout is not None
        pid_text, address, *worker_text = trainer.stdout.readline().split()
        trainer_pid, workers = int(pid_text), [int(p) for p in worker_text]
        assert len(workers) == 2
        # Slots for both workers and a weight segment: what a dead trainer can no longer unlink.
        assert len(our_segments(trainer_pid)) >= 3
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=NOTICE)
        if trainer.stdout is not None:
            trainer.stdout.close()
    deadline = time.monotonic() + NOTICE
    alive, segments = workers, our_segments(trainer_pid)
    while (alive or segments) and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        segments = our_segments(trainer_pid)
    assert not alive, f"workers {alive} outlived their trainer"
    assert not segments, f"shared-memory segments {segments} outlived their trainer"
    assert not Path(address.removeprefix("ipc://")).exists(), "the trainer's ipc socket file was left behind"
    assert not any(ledger.closed(pid) for pid in workers)  # they exited at once, not through a shutdown


async def test_a_slow_trainer_keeps_memory_bounded_and_loses_no_batch(start_method: str, ledger: Ledger) -> None:
    n_envs, steps, credits = 64, 128, 2
    # float64 observations: 64 sub-envs count past what float32 holds exactly.
    env = functools.partial(LedgerEnv, str(ledger.path), num_envs=n_envs, episode_length=50, dtype=torch.float64)
    checker = StreamChecker()
    process = psutil.Process()
    collector = MultiAsyncCollector(
        [env] * 2, LedgerPolicy(0.0), frames_per_batch=n_envs * steps, credits=credits, start_method=start_method
    )
    async with collector:

        def take(batch) -> None:  # type: ignore[no-untyped-def]
            checker.feed(int(batch["collector", "worker_id"][0, 0]), batch)

        with anyio.fail_after(60):
            take(await anext(collector))  # start-up done
            started = time.monotonic()
            for _ in range(6):
                take(await anext(collector))
        # Both workers collect side by side: one batch takes each of them about twice the time between two.
        batch_time = 2 * (time.monotonic() - started) / 6
        batch = await anext(collector)
        take(batch)
        batch_bytes = sum(
            int(t.numel()) * t.element_size() for t in batch.values(True, True) if isinstance(t, torch.Tensor)
        )
        del batch
        rss_before = process.memory_info().rss
        rss_max = rss_before
        for _ in range(5):
            await anyio.sleep(10 * batch_time)  # a trainer ten times slower than a batch
            with anyio.fail_after(NOTICE):
                take(await anext(collector))
            rss_max = max(rss_max, process.memory_info().rss)
        pids = list(collector.worker_pids)
        assert collector.dropped_batches == 0
    # Unchecked, each worker would have collected ~10 batches per batch consumed (~50 here): backpressure
    # holds every worker to the batches it has credits for.
    for worker, pid in enumerate(pids):
        assert pid is not None
        delivered = sum(i.steps for i in checker.streams[worker])
        assert ledger.steps(pid) <= delivered + credits * steps, f"worker {worker} collected ahead of its credits"
        assert len(checker.streams[worker]) == 1  # one incarnation, every batch in order: none dropped
    growth = rss_max - rss_before
    assert growth < 16 * batch_bytes, f"RSS grew by {growth / 2**20:.0f} MiB ({batch_bytes / 2**20:.1f} MiB batches)"
