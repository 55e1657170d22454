"""Lockstep run-ahead: a worker done with its part of a batch begins its part of the next one meanwhile.

Without it, the fastest worker idles until the slowest one's part is in. With it, each lockstep batch
still holds one part per worker, every worker's stream of steps stays contiguous, and a batch's parts
are chosen by one policy version even when weights are pushed while one worker already began its part
and the others were not asked for theirs yet.
"""

from __future__ import annotations

import functools
import random

import anyio
import torch
from multi_helpers import NestedProbe, stamp_time

from acollect import MultiSyncCollector
from acollect.testing import CountingEnv, SlowEnv

N_ENVS, T = 2, 10


async def test_the_fast_worker_steps_its_next_part_while_the_slow_one_finishes(start_method: str) -> None:
    fast = functools.partial(CountingEnv, num_envs=N_ENVS, episode_length=1000)
    slow = functools.partial(SlowEnv, 0.01, num_envs=N_ENVS, episode_length=1000)  # 100 ms per part
    async with MultiSyncCollector(
        [fast, slow], stamp_time, frames_per_batch=2 * N_ENVS * T, start_method=start_method
    ) as collector:
        with anyio.fail_after(60):
            batches = [await anext(collector) for _ in range(8)]
    early = 0
    for k in range(2, len(batches) - 1):  # the first batches are asked for on request: nothing runs ahead yet
        fast_began_next = batches[k + 1][0]["stamp"].min().item()
        slow_ended_this = batches[k][1]["stamp"].max().item()
        early += fast_began_next < slow_ended_this
        # Contiguous streams: each part continues where the worker's last part ended.
        for w in (0, 1):
            steps = batches[k + 1][w]["observation"][..., 0]
            before = batches[k][w]["observation"][..., 0]
            assert torch.equal(steps[:, 0], before[:, -1] + 1), f"worker {w}: a gap between batches {k} and {k + 1}"
    # Lockstep without run-ahead never begins the next part before the last part of this batch is in.
    assert early >= 3, f"the fast worker began its next part early in {early} of 5 batches"


async def test_a_push_while_one_worker_runs_ahead_leaves_every_batch_of_one_version(start_method: str) -> None:
    fast = functools.partial(CountingEnv, num_envs=N_ENVS, episode_length=1000)
    slow = functools.partial(SlowEnv, 0.002, num_envs=N_ENVS, episode_length=1000)
    rng = random.Random(0)
    seen: list[list[int]] = []
    async with MultiSyncCollector(
        [fast, slow], NestedProbe(0.0), frames_per_batch=2 * N_ENVS * T, start_method=start_method
    ) as collector:

        async def push_meanwhile() -> None:
            # Pushes land at any moment of a take, so some while the fast worker runs ahead (asked for the next
            # batch) and the slow one is not asked yet.
            for version in range(1, 41):
                await anyio.sleep(rng.uniform(0.0, 0.03))
                await collector.update_policy_weights_({"net.0.w": torch.full((1,), float(version))})

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(push_meanwhile)
                while collector.policy_version < 40 or len(seen) < 60:
                    batch = await anext(collector)
                    seen.append(batch["collector", "policy_version"].unique().tolist())
    mixed = [versions for versions in seen if len(versions) > 1]
    assert not mixed, f"{len(mixed)} of {len(seen)} batches mixed versions across their parts: {mixed[:5]}"
    assert len({v for versions in seen for v in versions}) > 5  # the pushes did land between batches
