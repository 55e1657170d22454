"""Who owns a handed-out batch: copies by default (valid for good), lent with ``copy_batches=False``."""

from __future__ import annotations

import anyio
import pytest

from acollect import AsyncCollector, ConfigurationError, MultiSyncCollector
from acollect.testing import CountingEnv, assert_counting_batch


def counting(num_envs: int = 2):
    return lambda: CountingEnv(num_envs=num_envs, episode_length=1000)


async def test_async_default_batches_outlive_their_slot(start_method: str) -> None:
    # One slot: the worker writes every batch into the same shared memory, which must not show through.
    async with AsyncCollector(
        counting(), frames_per_batch=8, credits=1, use_shared_memory=True, start_method=start_method
    ) as collector:
        first = await anext(collector)
        kept = first.clone()
        second = await anext(collector)
        await anext(collector)
    assert (first == kept).all()
    assert (second["observation"] - first["observation"] == 4).all()


async def test_async_lent_batch_is_the_slot_and_is_reused(start_method: str) -> None:
    async with AsyncCollector(
        counting(),
        frames_per_batch=8,
        credits=1,
        use_shared_memory=True,
        copy_batches=False,
        start_method=start_method,
    ) as collector:
        first = await anext(collector)
        kept = first.clone()
        assert_counting_batch(first)
        # While lent, the slot is not written: the worker has no credit left.
        await anyio.sleep(0.3)  # time in which the worker could (wrongly) overwrite it
        assert (first == kept).all()
        second = await anext(collector)
        assert_counting_batch(second)
        # The same memory, now holding the next batch: the first one is gone, as documented.
        assert second["observation"].data_ptr() == first["observation"].data_ptr()
        assert (first["observation"] == second["observation"]).all()
        assert (second["observation"] - kept["observation"] == 4).all()
        assert second["collector", "worker_id"].eq(0).all()


async def test_sync_lent_batches_reuse_one_buffer(start_method: str) -> None:
    # Batches this small travel as messages: they are gathered into one buffer, reused for every batch. (Through
    # shared memory, a lent batch is the segment the workers wrote: tests/multi/test_shared_batches.py.)
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, copy_batches=False, start_method=start_method
    ) as collector:
        first = await anext(collector)
        kept = first.clone()
        second = await anext(collector)
        assert second["observation"].data_ptr() == first["observation"].data_ptr()
        assert (first["observation"] == second["observation"]).all()
        assert (second["observation"] - kept["observation"] == 4).all()
        assert_counting_batch(second[0])


@pytest.mark.parametrize("use_shared_memory", [True, False])
async def test_sync_default_batches_are_fresh(start_method: str, use_shared_memory: bool) -> None:
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, use_shared_memory=use_shared_memory, start_method=start_method
    ) as collector:
        first = await anext(collector)
        second = await anext(collector)
    assert second["observation"].data_ptr() != first["observation"].data_ptr()


@pytest.mark.parametrize("value", ["no", 0, None])
def test_copy_batches_must_be_a_bool(value: object) -> None:
    with pytest.raises(ConfigurationError, match="copy_batches"):
        MultiSyncCollector([counting()] * 2, frames_per_batch=16, copy_batches=value)  # type: ignore[arg-type]
