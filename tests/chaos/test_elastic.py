"""Elastic collection: a worker lost for good (``on_worker_loss="continue"``) is dropped, the others collect on.

Workers are killed for real (SIGKILL of their process); every batch handed out after a loss must still be made of
real, gap-free transitions (:func:`~acollect.testing.assert_counting_batch`), and the collector breaks only when its
last worker is gone.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections import Counter

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    ConfigurationError,
    DistributedCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    WorkerCrashedError,
)
from acollect._workers.handles import WorkerState
from acollect.testing import SlowEnv, WeightProbe, assert_counting_batch, wait_until

#: Deadlines that bound a hang; they do not measure speed.
NOTICE = 10.0
N_ENVS, T = 2, 10


def env() -> SlowEnv:
    return SlowEnv(step_time=0.001, num_envs=N_ENVS, episode_length=7)


def kill(collector: MultiSyncCollector | MultiAsyncCollector, worker: int) -> int:
    pid = collector.worker_pids[worker]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


async def lost(collector: MultiSyncCollector | MultiAsyncCollector, count: int) -> None:
    await wait_until(lambda: collector.stats().lost_workers >= count, timeout=NOTICE, interval=0.01)


def loss_warnings(caplog: pytest.LogCaptureFixture, worker: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and f"worker {worker} is lost" in r.getMessage()]  # fmt: skip


async def test_multi_async_collects_on_with_the_workers_left(
    start_method: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="acollect")
    async with MultiAsyncCollector(
        [env] * 3, frames_per_batch=N_ENVS * T, on_worker_loss="continue", start_method=start_method
    ) as collector:
        await anext(collector)
        pids = collector.worker_pids
        kill(collector, 1)
        await lost(collector, 1)
        assert collector.worker_states == [WorkerState.READY, WorkerState.LOST, WorkerState.READY]
        # The lost worker's process is gone (its number free for another): no pid; the others' are unchanged.
        assert collector.worker_pids == [pids[0], None, pids[2]]
        by_worker: Counter[int] = Counter()
        with anyio.fail_after(60):
            for _ in range(16):
                batch = await anext(collector)
                assert batch.batch_size == (N_ENVS, T)
                assert_counting_batch(batch)
                by_worker[int(batch["collector", "worker_id"][0, 0])] += 1
        # Worker 1's batches received before its death may still be handed out (at most its credits); none after.
        assert by_worker[1] <= collector.credits
        assert by_worker[0] > 0
        assert by_worker[2] > 0
        stats = collector.stats()
        assert (stats.lost_workers, stats.restarts) == (1, 0)
        assert "1 lost workers" in stats.describe()
    warned = loss_warnings(caplog, 1)
    assert len(warned) == 1, warned
    assert "SIGKILL" in warned[0]


@pytest.mark.parametrize(("cat_results", "shape"), [(None, (2, N_ENVS, T)), (0, (2 * N_ENVS, T))])
async def test_multi_sync_batches_hold_the_live_workers_parts(
    start_method: str, cat_results: int | None, shape: tuple[int, ...]
) -> None:
    frames = 3 * N_ENVS * T
    async with MultiSyncCollector(
        [env] * 3, frames_per_batch=frames, total_frames=6 * frames, cat_results=cat_results,
        on_worker_loss="continue", start_method=start_method,
    ) as collector:  # fmt: skip
        first = await anext(collector)
        assert first.numel() == frames
        kill(collector, 1)
        await lost(collector, 1)
        assert collector.worker_states[1] is WorkerState.LOST
        batches = 1
        with anyio.fail_after(60):
            async for batch in collector:
                batches += 1
                assert batch.batch_size == shape
                assert_counting_batch(batch)
        # total_frames counts frames: batches of two parts of three, so more of them.
        assert batches == 1 + math.ceil(5 * frames / (2 * N_ENVS * T))
        assert collector.stats().frames == frames + (batches - 1) * 2 * N_ENVS * T
        assert collector.frames_per_batch == frames  # what a batch of every worker holds
        assert collector.stats().lost_workers == 1


async def test_a_worker_killed_twice_is_restarted_then_lost(start_method: str) -> None:
    async with MultiSyncCollector(
        [env] * 3, frames_per_batch=3 * N_ENVS * T, max_worker_restarts=1, on_worker_loss="continue",
        start_method=start_method,
    ) as collector:  # fmt: skip
        await anext(collector)
        first = kill(collector, 0)
        await wait_until(
            lambda: collector.worker_pids[0] not in (first, None) and collector.worker_states[0] is WorkerState.READY,
            timeout=NOTICE,
        )
        with anyio.fail_after(NOTICE):
            batch = await anext(collector)
        assert batch.batch_size == (3, N_ENVS, T)  # the restart: every worker's part
        assert_counting_batch(batch)
        assert collector.stats().lost_workers == 0
        kill(collector, 0)
        await lost(collector, 1)
        with anyio.fail_after(NOTICE):
            for _ in range(3):
                batch = await anext(collector)
                assert batch.batch_size == (2, N_ENVS, T)
                assert_counting_batch(batch)
        stats = collector.stats()
        assert (stats.restarts, stats.lost_workers) == (1, 1)
        assert collector.worker_states == [WorkerState.LOST, WorkerState.READY, WorkerState.READY]


@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector])
async def test_the_last_worker_lost_breaks_the_collector(
    start_method: str, kind: type[MultiSyncCollector] | type[MultiAsyncCollector]
) -> None:
    async with kind(
        [env] * 2, frames_per_batch=2 * N_ENVS * T, on_worker_loss="continue", start_method=start_method
    ) as collector:
        await anext(collector)
        kill(collector, 0)
        await lost(collector, 1)
        await anext(collector)
        kill(collector, 1)
        with anyio.fail_after(NOTICE), pytest.raises(WorkerCrashedError) as info:
            async for _ in collector:
                pass
        assert collector.worker_states == [WorkerState.LOST, WorkerState.DEAD]
        assert collector.stats().lost_workers == 1  # the last one broke the collector: it is not counted as lost
    assert info.value.worker_id == 1
    assert info.value.exitcode == -signal.SIGKILL


async def test_weights_pause_and_seeds_skip_a_lost_worker(start_method: str) -> None:
    async with MultiSyncCollector(
        [env] * 3, WeightProbe(0.0), frames_per_batch=3 * N_ENVS * T, on_worker_loss="continue",
        start_method=start_method,
    ) as collector:  # fmt: skip
        await anext(collector)
        kill(collector, 2)
        # At once, before the loss is noticed: the push waits for the liveness loop to decide, then needs no
        # acknowledgement of a worker gone for good.
        with anyio.fail_after(NOTICE):
            version = await collector.update_policy_weights_(WeightProbe(1.0), timeout=NOTICE)
        assert collector.stats().lost_workers == 1
        with anyio.fail_after(NOTICE):
            batch = await anext(collector)
            while batch["collector", "policy_version"].min() < version:  # the batch collected ahead of the push
                batch = await anext(collector)
        assert batch.batch_size == (2, N_ENVS, T)
        assert (batch["action"] == 1).all()
        # Again, the loss known: the push is acknowledged by the two live workers only.
        with anyio.fail_after(NOTICE):
            await collector.update_policy_weights_(WeightProbe(0.0), timeout=NOTICE)
            async with collector.pause():
                pass
            collector.set_seed(7)
            for _ in range(2):
                batch = await anext(collector)
                assert batch.batch_size == (2, N_ENVS, T)
                assert_counting_batch(batch)
        assert collector.worker_states[2] is WorkerState.LOST


class Parity(torch.nn.Module):
    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0].long() % 2


async def test_the_inference_server_stops_waiting_for_a_lost_worker(start_method: str) -> None:
    # A pass runs when every worker waits, or after max_wait: were the lost worker still awaited, every step of
    # the others would take max_wait (far longer than the deadline below).
    async with AsyncBatchedCollector(
        [env] * 3, TensorDictModule(Parity(), in_keys=["observation"], out_keys=["action"]),
        frames_per_batch=N_ENVS * T, max_wait=600.0, server="thread", on_worker_loss="continue",
        start_method=start_method,
    ) as collector:  # fmt: skip
        with anyio.fail_after(60):
            await anext(collector)
        kill(collector, 0)
        await lost(collector, 1)
        by_worker: Counter[int] = Counter()
        with anyio.fail_after(60):
            for _ in range(8):
                batch = await anext(collector)
                assert_counting_batch(batch)
                assert (batch["action"] == batch["observation"][..., 0].long() % 2).all()
                by_worker[int(batch["collector", "worker_id"][0, 0])] += 1
        assert by_worker[0] <= collector.credits
        assert by_worker[1] > 0
        assert by_worker[2] > 0


def test_a_bad_value_names_the_option() -> None:
    with pytest.raises(ConfigurationError, match=r"on_worker_loss='skip'.*'raise', 'continue'"):
        MultiAsyncCollector([env] * 2, frames_per_batch=8, on_worker_loss="skip")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: AsyncCollector(env, frames_per_batch=8, on_worker_loss="continue"), "one worker"),
        (lambda: DistributedCollector([env] * 2, frames_per_batch=8, on_worker_loss="continue"), "cannot lose a rank"),
    ],
)
def test_collectors_that_cannot_lose_a_worker_refuse_the_option(make: object, why: str) -> None:
    with pytest.raises(ConfigurationError, match=f"on_worker_loss.*{why}"):
        make()  # type: ignore[operator]


async def test_whole_episodes_of_a_lost_worker_are_handed_out_cut_at_once(start_method: str) -> None:
    # Episodes far longer than a batch: the lost worker's episodes in progress could only end by its next batch,
    # which never comes; they are handed out, truncated at their last frame, as soon as the loss is known.
    def long_episodes() -> SlowEnv:
        return SlowEnv(step_time=0.001, num_envs=N_ENVS, episode_length=100_000)

    async with MultiAsyncCollector(
        [long_episodes] * 2, frames_per_batch=N_ENVS * T, trajs_per_batch=N_ENVS, total_frames=-1,
        on_worker_loss="continue", start_method=start_method,
    ) as collector:  # fmt: skip
        taken = []

        async def take() -> None:  # pulls batches into episodes, waiting for two to end
            taken.append(await anext(collector))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                await wait_until(lambda: collector.frames >= 4 * N_ENVS * T, timeout=NOTICE, interval=0.01)
                assert not taken
                kill(collector, 1)
                await lost(collector, 1)
        # Nothing else could end an episode: the batch holds the lost worker's episodes, cut.
        (batch,) = taken
        assert batch.batch_size[0] == N_ENVS
        traj_ids = batch["collector", "traj_ids"][:, 0]
        assert (traj_ids % 2 == 1).all()  # worker 1 of 2 numbers its trajectories 1, 3, 5, ...
        mask = batch["collector", "mask"]
        last = mask.sum(-1) - 1
        rows = torch.arange(batch.batch_size[0])
        assert batch["next", "truncated"][rows, last].all()
        assert batch["next", "done"][rows, last].all()
