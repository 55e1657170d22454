"""Chaos: cancel the consuming task at random points of a collector's life, and find nothing left behind.

Each round runs a short trainer (start-up, batches, a weight push, a pause, shutdown) and cancels it at a
random moment inside one of those phases, in turn. After each round: no child process, acollect thread,
shared-memory segment, open file descriptor (ZeroMQ sockets and contexts) or ipc socket file remains.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from pathlib import Path

import anyio
from chaos_helpers import Ledger, LedgerEnv, LedgerPolicy, env_int, ipc_file_exists, never_built

from acollect import CollectorState, MultiAsyncCollector, MultiSyncCollector
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.testing import ResourceSnapshot, leaked_resources

CANCELS = env_int("ACOLLECT_CHAOS_CANCELS", 40)
PHASES = ("start-up", "batch", "weights", "pause", "shutdown")
# How long after entering its phase a round may be cancelled (seconds): about the phase's length.
SPREAD = {"start-up": 0.4, "batch": 0.02, "weights": 0.01, "pause": 0.05, "shutdown": 0.05}


def make_collector(kind: int, ledger: Ledger, address: str, start_method: str) -> MultiCollectorBase:
    env = functools.partial(LedgerEnv, str(ledger.path), num_envs=2, step_time=0.0002)
    cls = MultiSyncCollector if kind % 2 == 0 else MultiAsyncCollector
    # Large enough batches go through shared-memory slots, small ones as frames: both kinds of cleanup.
    return cls(
        [env] * 2,
        LedgerPolicy(0.0),
        frames_per_batch=40,
        address=address,
        use_shared_memory=kind % 4 < 2,
        start_method=start_method,
        shutdown_timeout=3.0,
    )


async def trainer(collector: MultiCollectorBase, arm: Callable[[str], None]) -> None:
    """A short trainer's life; ``arm(phase)`` is called as each phase begins."""
    arm("start-up")
    async with collector:
        arm("batch")
        await anext(collector)
        await anext(collector)
        arm("weights")
        await collector.update_policy_weights_(LedgerPolicy(1.0))
        arm("pause")
        async with collector.pause():
            await anyio.sleep(0.05)
        await anext(collector)
        arm("shutdown")


async def test_cancelling_the_consumer_anywhere_leaves_nothing_behind(
    start_method: str, ledger: Ledger, rng: random.Random, tmp_path: Path
) -> None:
    # A first collector starts what lives as long as this process (the fork server, pyzmq's garbage
    # collector thread) before the baselines are taken.
    async with make_collector(0, ledger, f"ipc://{tmp_path}/warm.sock", start_method) as warm:
        await anext(warm)
    baseline = ResourceSnapshot.take()
    loop = asyncio.get_running_loop()
    hit = dict.fromkeys(PHASES, 0)
    for i in range(CANCELS):
        phase = PHASES[i % len(PHASES)]
        address = f"ipc://{tmp_path}/round{i}.sock"
        collector = make_collector(i // len(PHASES), ledger, address, start_method)
        with anyio.CancelScope() as scope:

            def arm(entered: str, scope: anyio.CancelScope = scope, phase: str = phase) -> None:
                if entered == phase:
                    loop.call_later(rng.uniform(0, SPREAD[phase]), scope.cancel)

            with anyio.fail_after(60):  # a hang is a failure, not a stuck suite
                await trainer(collector, arm)
        if scope.cancelled_caught:
            hit[phase] += 1
        assert collector.state is CollectorState.CLOSED, f"round {i} ({phase}): collector left {collector.state}"
        left = leaked_resources(baseline, fds_slack=0)  # ZeroMQ sockets and contexts hold file descriptors
        assert not left, f"round {i}, cancelled during {phase}: {left}"
        assert not ipc_file_exists(address), f"round {i}: ipc socket file left"
    # Most rounds were really cancelled (the rest finished before their random moment came).
    assert sum(hit.values()) >= CANCELS // 2, hit
    print(f"\ncancelled {sum(hit.values())} of {CANCELS} rounds, per phase: {hit}")


async def test_a_cancelled_set_up_gives_control_back_at_once(
    start_method: str, rng: random.Random, tmp_path: Path
) -> None:
    # Workers that never said hello (still booting, or building their env) hold nothing: a set-up cancelled then ends
    # them at once instead of waiting for them to read ``stop``, which these never would: their env is never built.
    # A cancellation that waited for them would wait out shutdown_timeout (an hour here): the deadline below, which
    # only such a hang misses, fails it. How soon control comes back is a figure: benchmarks/cancel.py measures it.
    for i in range(4):
        cls = MultiSyncCollector if i % 2 == 0 else MultiAsyncCollector
        collector = cls(
            [never_built] * 2,
            frames_per_batch=40,
            address=f"ipc://{tmp_path}/boot{i}.sock",
            # Spawned workers boot for the longest, so the earlier moments fall inside the boot, the later ones
            # (forked from the fork server) while the env is being built.
            start_method="spawn" if i < 2 else start_method,
            shutdown_timeout=3600,
            startup_timeout=3600,
        )
        with anyio.fail_after(30):
            with anyio.move_on_after(rng.uniform(0.05, 0.4)) as scope:
                await anext(collector)
            assert scope.cancelled_caught, "a worker said hello: nothing was tested"
            await collector.async_shutdown()
        assert collector.state is CollectorState.CLOSED
