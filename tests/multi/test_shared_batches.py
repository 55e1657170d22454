"""Lockstep batches written in place: one shared segment per batch in flight, each worker its own rows."""

from __future__ import annotations

import os
import signal

import anyio
import pytest
import torch
from tensordict import TensorDict

from acollect import MultiSyncCollector
from acollect._batches.shared_batches import SharedBatches
from acollect._runtime.layout import combined_layout, part_of
from acollect._runtime.wire import encode_tensordict
from acollect.errors import ProtocolError
from acollect.testing import CountingEnv, assert_counting_batch, wait_until


def counting(num_envs: int = 2, episode_length: int = 1000):
    return lambda: CountingEnv(num_envs=num_envs, episode_length=episode_length)


def _row_bytes(t: torch.Tensor) -> int:
    return t[0].numel() * t.element_size()


async def test_a_lent_batch_is_one_segment_holding_each_workers_rows_in_order(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, copy_batches=False, use_shared_memory=True, start_method=start_method
    ) as collector:
        first = await anext(collector)
        obs = first["observation"]
        # One piece of memory, no gather: worker 1's rows lie right after worker 0's.
        assert obs.is_contiguous()
        assert obs[1].data_ptr() == obs[0].data_ptr() + _row_bytes(obs)
        for worker in (0, 1):
            assert_counting_batch(first[worker])
            # Trajectory ids are unique across workers: worker w's are w modulo the number of workers.
            assert (first["collector", "traj_ids"][worker] % 2 == worker).all()
        kept = first.clone()
        await anyio.sleep(0.3)  # the workers collect the next batch ahead meanwhile: into the other segment
        assert (first == kept).all()
        second = await anext(collector)
        assert second["observation"].data_ptr() != obs.data_ptr()
        assert (second["observation"] - kept["observation"] == 4).all()  # contiguous streams
        third = await anext(collector)
        assert third["observation"].data_ptr() not in (obs.data_ptr(), second["observation"].data_ptr())
        assert (first == kept).all(), "a segment lent and held is never written: the workers write others"
        assert (third["observation"] - kept["observation"] == 8).all()
        address = obs.data_ptr()
        del first, obs
        for _ in range(4):  # dropped: its segment goes back to the workers, and comes round again
            batch = await anext(collector)
            if batch["observation"].data_ptr() == address:
                break
        else:
            raise AssertionError("the segment of a dropped batch never came back")


async def test_concatenated_batches_are_written_in_place_too(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting()] * 2,
        frames_per_batch=16,
        cat_results=0,
        copy_batches=False,
        use_shared_memory=True,
        start_method=start_method,
    ) as collector:
        batch = await anext(collector)
        assert batch.batch_size == (4, 4)
        obs = batch["observation"]
        assert obs.is_contiguous()
        assert obs[2].data_ptr() == obs[0].data_ptr() + 2 * _row_bytes(obs)
        assert (batch["collector", "traj_ids"][:2] % 2 == 0).all()
        assert (batch["collector", "traj_ids"][2:] % 2 == 1).all()
        assert_counting_batch(batch)


async def test_copied_batches_are_copied_out_of_the_segments(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, use_shared_memory=True, copy_batches=True, start_method=start_method
    ) as collector:
        first = await anext(collector)
        kept = first.clone()
        for _ in range(4):  # every segment is written again meanwhile
            await anext(collector)
        assert (first == kept).all()
        assert_counting_batch(first)


async def test_a_restarted_worker_writes_the_same_rows_and_spares_a_held_batch(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting(2, episode_length=5)] * 2,
        frames_per_batch=40,
        copy_batches=False,
        use_shared_memory=True,
        max_worker_restarts=1,
        start_method=start_method,
    ) as collector:
        held = await anext(collector)
        kept = held.clone()
        assert collector.pool is not None
        # Killed between batches: the first batch is asked for on request, nothing ahead of it, so the worker holds
        # no part as it dies and none is lost.
        assert collector.pool.handles[0].lockstep.outstanding == 0
        dead = collector.worker_pids[0]
        os.kill(dead, signal.SIGKILL)
        with anyio.fail_after(60):
            await wait_until(lambda: collector.worker_pids[0] not in (dead, None), timeout=60)
            for _ in range(3):  # the new worker writes these into the segments not lent
                batch = await anext(collector)
                assert batch.batch_size == (2, 2, 10)
                assert_counting_batch(batch)
        assert (held == kept).all()
        assert collector.dropped_batches == 0


def _layout(n_envs: int) -> dict:
    td = TensorDict({"obs": torch.zeros(n_envs, 3, 2), "next": {"r": torch.zeros(n_envs, 3)}}, batch_size=[n_envs, 3])
    td.names = [None, "time"]
    return encode_tensordict(td)[0]


def test_combined_layouts_and_their_parts() -> None:
    stacked, parts = combined_layout([_layout(2), _layout(2)], stack=True)  # type: ignore[misc]
    assert stacked["batch_size"] == [2, 2, 3]
    assert stacked["names"] == [None, None, "time"]
    assert parts == [0, 1]
    assert combined_layout([_layout(2), _layout(3)], stack=True) is None  # stacking needs equal shapes
    cat, rows = combined_layout([_layout(2), _layout(3)], stack=False)  # type: ignore[misc]
    assert cat["batch_size"] == [5, 3]
    assert rows == [[0, 2], [2, 5]]
    assert cat["leaves"][0]["nbytes"] == 5 * 3 * 2 * 4
    whole = TensorDict({"obs": torch.arange(5 * 3 * 2).view(5, 3, 2)}, batch_size=[5, 3])
    assert part_of(whole, [2, 5])["obs"].data_ptr() == whole["obs"][2].data_ptr()
    for bad in ([3, 2], [0, 6], 5, "0"):
        with pytest.raises(ProtocolError):
            part_of(whole, bad)


def test_a_segment_is_free_once_every_part_is_given_back() -> None:
    shared = SharedBatches.create([_layout(2), _layout(2)], stack=True, n_slots=2)
    assert shared is not None
    try:
        a, b = shared.acquire(), shared.acquire()
        assert (a, b, shared.acquire()) == (0, 1, None)
        # What a worker writes into its rows is the trainer's view of the whole batch.
        shared.part_ring(1)[a].tensordict["obs"].fill_(7)
        assert shared.batch(a)["obs"][1].eq(7).all()
        assert shared.batch(a)["obs"][0].ne(7).all()
        shared.give_back(a)
        assert shared.acquire() is None  # one part still out
        shared.give_back(a)
        assert shared.acquire() == a
        with pytest.raises(ProtocolError, match="worker 1"):
            shared.check_one_slot({0: a, 1: b}, a)
    finally:
        shared.close()


def test_a_batch_of_the_live_workers_parts_frees_its_segment_once_they_are_given_back() -> None:
    shared = SharedBatches.create([_layout(2), _layout(2), _layout(2)], stack=True, n_slots=1)
    assert shared is not None
    try:
        a = shared.acquire()
        assert a is not None
        shared.expect(a, 2)  # a worker was lost: the batch holds two parts of three
        shared.give_back(a)
        assert shared.acquire() is None
        shared.give_back(a)
        assert shared.acquire() == a
        # The next batch in that segment holds every worker's part again, unless told otherwise.
        for _ in range(2):
            shared.give_back(a)
        assert shared.acquire() is None
        shared.give_back(a)
        assert shared.acquire() == a
    finally:
        shared.close()
