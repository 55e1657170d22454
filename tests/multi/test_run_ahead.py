"""Lockstep run-ahead: a worker done with its part of a batch begins its part of the next one meanwhile.

Without it, the fastest worker idles until the slowest one's part is in. With it, each lockstep batch
still holds one part per worker, every worker's stream of steps stays contiguous, and a batch's parts
are chosen by one policy version even when weights are pushed while one worker already began its part
and the others were not asked for theirs yet.
"""

from __future__ import annotations

import functools
import itertools
import random
from pathlib import Path

import anyio
import torch
from multi_helpers import NestedProbe

from acollect import MultiSyncCollector
from acollect.testing import CountingEnv, Gate, SlowEnv, wait_until

N_ENVS, T = 2, 10


async def test_the_fast_worker_steps_its_next_part_while_the_slow_one_finishes(
    start_method: str, tmp_path: Path
) -> None:
    # The slow worker is held at a gate mid-way through its part of the third batch (the first batch asked for ahead:
    # the first two are asked for on request). Meanwhile the fast worker's part of the fourth batch arrives: lockstep
    # without run-ahead never asks for it before the third batch is whole, so the wait below would never end.
    # How much run-ahead gains is a figure: docs/performance.md, "MultiSync running ahead".
    fast = functools.partial(CountingEnv, num_envs=N_ENVS, episode_length=1000)
    with Gate(tmp_path) as gate:
        slow = gate.env(hold_at_step=2 * T + T // 2, num_envs=N_ENVS, episode_length=1000)
        async with MultiSyncCollector([fast, slow], frames_per_batch=2 * N_ENVS * T, start_method=start_method) as c:
            assert c.pool is not None
            batches = [await anext(c), await anext(c)]

            async def take(n: int) -> None:
                batches.extend([await anext(c) for _ in range(n)])

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(take, 3)
                    await gate.wait_held()
                    await wait_until(lambda: c.pool is not None and c.pool.handles[0].lockstep.part(4) is not None)
                    assert len(batches) == 2, "the third batch was handed out while its slow part was held"
                    gate.open()
    # Contiguous streams: each part continues where the worker's last part ended.
    for w in (0, 1):
        for before, after in itertools.pairwise(batches):
            steps, last = after[w]["observation"][..., 0], before[w]["observation"][..., 0]
            assert torch.equal(steps[:, 0], last[:, -1] + 1), f"worker {w}: a gap between two batches"


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
