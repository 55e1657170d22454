"""Random actions (no policy, or ``init_random_frames``) follow ``set_seed`` and differ from worker to worker.

On every collector kind that takes random actions: the first batch of each worker is collected unseeded twice,
with seed 1 twice and with seed 2. Two workers, and two unseeded runs, never repeat each other's actions (an
unseeded generator starts from fresh entropy, not from torch's one fixed default); the same seed gives the same
actions (and observations), another seed other actions. CartPole's actions are binary, so the ``4 x 8`` actions
of a worker's first batch repeat by chance with probability ``2**-32``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import anyio
import pytest
import torch
from tensordict import TensorDictBase

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    CollectorBase,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from acollect.envs import AsyncEnvPool, GymEnv
from acollect.testing import AsyncCountingEnv, no_leaks

START_METHOD = "forkserver"
N_ENVS, STEPS = 4, 8

_gym = functools.partial(GymEnv, "CartPole-v1", num_envs=N_ENVS)
_coroutine_envs = functools.partial(AsyncEnvPool, AsyncCountingEnv, num_envs=N_ENVS)


def _zeros(td: TensorDictBase) -> TensorDictBase:
    """The inference server's policy: never taken while ``init_random_frames`` lasts."""
    return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))


# Each kind that takes random actions, with two workers where it has workers to compare.
KINDS: dict[str, Callable[[], CollectorBase]] = {
    "Collector": lambda: Collector(_gym, frames_per_batch=N_ENVS * STEPS),
    "Collector-coroutine-envs": lambda: Collector(_coroutine_envs, frames_per_batch=N_ENVS * STEPS),
    "Collector-init_random_frames": lambda: Collector(
        _gym, _zeros, frames_per_batch=N_ENVS * STEPS, init_random_frames=10**6
    ),
    "MultiSyncCollector": lambda: MultiSyncCollector(
        [_gym] * 2, frames_per_batch=2 * N_ENVS * STEPS, start_method=START_METHOD
    ),
    "MultiSyncCollector-coroutine-envs": lambda: MultiSyncCollector(
        [_coroutine_envs] * 2, frames_per_batch=2 * N_ENVS * STEPS, start_method=START_METHOD
    ),
    "MultiAsyncCollector": lambda: MultiAsyncCollector(
        [_gym] * 2, frames_per_batch=N_ENVS * STEPS, start_method=START_METHOD
    ),
    "AsyncCollector": lambda: AsyncCollector(_gym, frames_per_batch=N_ENVS * STEPS, start_method=START_METHOD),
    "AsyncBatchedCollector-init_random_frames": lambda: AsyncBatchedCollector(
        [_gym] * 2,
        _zeros,
        frames_per_batch=N_ENVS * STEPS,
        init_random_frames=10**6,
        server="thread",
        start_method=START_METHOD,
    ),
}


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    with no_leaks():
        yield


async def _first_batches(kind: str, seed: int | None) -> list[TensorDictBase]:
    """The first batch of each worker (one for the in-process collector), seeded before the first batch."""
    collector = KINDS[kind]()
    if seed is not None:
        collector.set_seed(seed)
    firsts: dict[int, TensorDictBase] = {}
    async with collector:
        with anyio.fail_after(60):
            async for batch in collector:
                if batch.ndim == 3:  # MultiSync: one part per worker, stacked
                    return list(batch.unbind(0))
                worker = int(batch["collector", "worker_id"][0, 0]) if ("collector", "worker_id") in batch else 0
                firsts.setdefault(worker, batch)
                if len(firsts) == getattr(collector, "num_workers", 1):
                    break
    return [firsts[w] for w in sorted(firsts)]


def _actions(batches: list[TensorDictBase]) -> list[torch.Tensor]:
    actions = [b["action"] for b in batches]
    for action in actions:
        assert action.shape == (N_ENVS, STEPS)
    return actions


@pytest.mark.parametrize("kind", KINDS)
async def test_random_actions_follow_the_seed_and_differ_across_workers(kind: str) -> None:
    unseeded = _actions(await _first_batches(kind, None))
    unseeded_again = _actions(await _first_batches(kind, None))
    seed_1 = await _first_batches(kind, 1)
    seed_1_again = await _first_batches(kind, 1)
    seed_2 = _actions(await _first_batches(kind, 2))

    for run in (unseeded, _actions(seed_1), seed_2):
        for w in range(1, len(run)):
            assert not torch.equal(run[0], run[w]), f"workers 0 and {w} took the same random actions"
    for first, again in zip(unseeded, unseeded_again, strict=True):
        assert not torch.equal(first, again), "two unseeded runs took the same random actions"
    for w, (first, again) in enumerate(zip(seed_1, seed_1_again, strict=True)):
        torch.testing.assert_close(again["action"], first["action"], msg=f"worker {w}: seed 1 twice, other actions")
        torch.testing.assert_close(again["observation"], first["observation"], msg=f"worker {w}: other observations")
    for w, (first, other) in enumerate(zip(_actions(seed_1), seed_2, strict=True)):
        assert not torch.equal(first, other), f"worker {w}: seeds 1 and 2 gave the same random actions"
