"""Who owns a handed-out batch: the caller, for as long as it holds any tensor of it.

By default a batch is the workers' shared memory itself, lent: never written again while the caller holds a
tensor over it (the batch, a view, a slice, a numpy array of it), and given back to its worker once the last one
is gone. ``copy_batches=True`` hands out copies instead. Beyond ``max_lent_bytes`` batches are copies too.
"""

from __future__ import annotations

import gc
import itertools
import random

import anyio
import pytest
from tensordict import TensorDictBase

from acollect import AsyncCollector, ConfigurationError, MultiAsyncCollector, MultiSyncCollector
from acollect.testing import CountingEnv, PixelEnv, assert_counting_batch


def counting(num_envs: int = 2):
    return lambda: CountingEnv(num_envs=num_envs, episode_length=1000)


def pixels():
    return PixelEnv(num_envs=4)


async def test_a_lent_batch_is_the_slot_and_goes_back_to_its_worker_when_dropped(start_method: str) -> None:
    # One credit: the worker writes into a second slot while the first is lent, never into the lent one.
    async with AsyncCollector(
        counting(), frames_per_batch=8, credits=1, use_shared_memory=True, start_method=start_method
    ) as collector:
        first = await anext(collector)
        kept = first.clone()
        assert collector.lent["batches"] == 1
        assert collector.lent["bytes"] > 0
        second = await anext(collector)
        third = await anext(collector)
        assert (first == kept).all(), "a batch still held is never written"
        assert second["observation"].data_ptr() != first["observation"].data_ptr()
        assert_counting_batch(third)
        del first, second
        gc.collect()
        await anext(collector)  # the loans that came back are given back before each batch
        assert collector.lent["batches"] <= 2  # the last two handed out: ``third`` and the one just taken
        assert (third["observation"] - kept["observation"] == 8).all()


@pytest.mark.parametrize("kind", ["MultiSync", "MultiAsync"])
async def test_kept_batches_and_views_stay_equal_to_their_clones_while_collection_goes_on(
    kind: str, start_method: str
) -> None:
    # A trainer that keeps 100 batches (whole, as views, as sub-TensorDicts, as numpy arrays) and collects 300 more.
    cls = MultiSyncCollector if kind == "MultiSync" else MultiAsyncCollector
    rng = random.Random(0)
    kept: list[tuple[object, object]] = []
    async with cls([pixels] * 2, frames_per_batch=32, total_frames=-1, start_method=start_method,
                   max_lent_bytes=1 << 30) as collector:  # fmt: skip
        for i in range(400):
            batch = await anext(collector)
            if i < 100:
                shape = rng.choice(["whole", "view", "sub", "numpy"])
                if shape == "whole":
                    kept.append((batch, batch.clone()))
                elif shape == "view":
                    view = batch["pixels"][..., 1:3, :, :]
                    kept.append((view, view.clone()))
                elif shape == "sub":
                    sub = batch[:1] if kind == "MultiSync" else batch[..., :2]
                    kept.append((sub, sub.clone()))
                else:
                    array = batch["next", "pixels"].numpy()
                    kept.append((array, array.copy()))
            del batch
        lent = collector.lent
        assert lent["lent_so_far"] >= 300, "batches are lent, not copied, while the budget has room"
        for held, copy in kept:
            if isinstance(held, TensorDictBase):
                assert (held == copy).all()
            else:
                assert (held == copy).all()  # tensors and numpy arrays alike
        assert lent["batches"] >= 1
    del kept, held, copy
    gc.collect()


async def test_memory_comes_back_when_the_caller_drops_every_tensor_of_a_batch(start_method: str) -> None:
    async with MultiAsyncCollector([pixels] * 2, frames_per_batch=32, start_method=start_method) as collector:
        held = [await anext(collector) for _ in range(6)]
        assert collector.lent["batches"] == 6
        view = held[0]["pixels"][0]
        del held
        gc.collect()
        last = await anext(collector)
        assert collector.lent["batches"] == 2, "five of six came back; one lives on in ``view``, one just came"
        del view, last
        gc.collect()
        last = await anext(collector)
        assert collector.lent["batches"] == 1, "only the batch just handed out is lent"
        assert last.batch_size[0] == 4


async def test_beyond_the_budget_batches_are_copies_and_collection_goes_on(start_method: str) -> None:
    # A budget of two batches and a caller that keeps everything: the rest come as copies, nothing stalls.
    async with MultiAsyncCollector([pixels], frames_per_batch=32, max_lent_bytes=2 * 32 * 2 * 84 * 84 * 4 + 4096,
                                   start_method=start_method) as collector:  # fmt: skip
        with anyio.fail_after(60):
            kept = [await anext(collector) for _ in range(12)]
        lent = collector.lent
        assert lent["batches"] <= 2
        assert lent["copies_over_budget"] >= 10
        for a, b in itertools.pairwise(kept):
            assert a["pixels"].data_ptr() != b["pixels"].data_ptr()


@pytest.mark.parametrize("use_shared_memory", [True, False])
async def test_copied_batches_are_fresh(start_method: str, use_shared_memory: bool) -> None:
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, use_shared_memory=use_shared_memory, copy_batches=True,
        start_method=start_method,
    ) as collector:  # fmt: skip
        first = await anext(collector)
        second = await anext(collector)
        assert collector.lent["batches"] == 0
    assert second["observation"].data_ptr() != first["observation"].data_ptr()


@pytest.mark.parametrize("value", ["no", 0, None])
def test_copy_batches_must_be_a_bool(value: object) -> None:
    with pytest.raises(ConfigurationError, match="copy_batches"):
        MultiSyncCollector([counting()] * 2, frames_per_batch=16, copy_batches=value)  # type: ignore[arg-type]


def test_max_lent_bytes_must_be_a_positive_int() -> None:
    with pytest.raises(ConfigurationError, match="max_lent_bytes"):
        MultiSyncCollector([counting()] * 2, frames_per_batch=16, max_lent_bytes=0)


async def test_a_dropped_lent_batch_goes_back_with_its_workers_next_credit(start_method: str) -> None:
    # One word a batch to the workers: the credit, carrying the slot of the worker's batch dropped since. Local workers
    # get it down their pipe, so no message goes to them at all while they collect.
    async with MultiAsyncCollector(
        [counting()] * 2, frames_per_batch=8, total_frames=-1, credits=2, use_shared_memory=True,
        start_method=start_method,
    ) as collector:  # fmt: skip
        await anext(collector)
        pool = collector.pool
        assert all(h.memory.pipe is not None for h in pool.handles)
        sent: list[str] = []  # messages
        words: list[tuple[str, int | None]] = []  # credits and slots back, by whatever road
        real_send, real_credit, real_free = pool.send, pool.credit, pool.free

        async def counted(handle, kind, fields=None, td=None):  # the real send, its kinds noted
            sent.append(kind)
            await real_send(handle, kind, fields, td)

        async def credited(handle, slot=None):
            words.append(("credit", slot))
            await real_credit(handle, slot)

        async def freed(handle, slot):
            words.append(("free", slot))
            await real_free(handle, slot)

        pool.send, pool.credit, pool.free = counted, credited, freed
        batches = 200
        for _ in range(batches):
            batch = await anext(collector)
            assert_counting_batch(batch)
            del batch  # dropped before the next: its slot goes back with that worker's next credit
        assert collector.lent["lent_so_far"] >= batches
        assert [kind for kind, _ in words].count("credit") == batches
        assert [kind for kind, _ in words].count("free") == 0, "each freed slot rode on a credit"
        assert sum(slot is not None for _, slot in words) >= batches - 4  # each but the first of each worker's
        # No message per batch: the words went down the credit pipes. Only a ring grows, once, at its first lend.
        assert set(sent) <= {"slots"}, sent
        assert len(sent) <= 2, sent
        # A slot for each credit and one for the batch lent: no more than when the slot went back at once.
        assert [len(h.memory.ring) for h in pool.handles] == [3, 3]

        # A caller that keeps several batches of a worker, then drops them: the slots beyond the first that the
        # next credit carries go back one a word, and collection goes on without the rings growing further.
        held = [await anext(collector) for _ in range(8)]
        sizes = [len(h.memory.ring) for h in pool.handles]
        del held
        gc.collect()
        words.clear()
        for _ in range(40):
            batch = await anext(collector)
            assert_counting_batch(batch)
            del batch
        assert [kind for kind, _ in words].count("free") >= 1
        assert [len(h.memory.ring) for h in pool.handles] == sizes
        assert collector.lent["batches"] <= 1
