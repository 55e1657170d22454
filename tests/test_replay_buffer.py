"""Tests for acollect.replay_buffer: circular order, flattening, sampling, locking, errors."""

from __future__ import annotations

import threading

import anyio
import anyio.lowlevel
import pytest
import torch
from tensordict import TensorDict

from acollect.errors import AcollectError, ConfigurationError
from acollect.replay_buffer import EmptyBufferError, ReplayBuffer

OBS_DIM = 4


def collector_batch(*batch_dims: int, start: int = 0) -> TensorDict:
    """A batch laid out like a collector's, whose transitions carry consecutive integer ids.

    Every leaf of transition ``i`` (row-major over the batch dims) encodes ``start + i``, so a
    test can check which transitions ended up where, and that no transition mixes two ids.
    """
    n = 1
    for d in batch_dims:
        n *= d
    ids = torch.arange(start, start + n).reshape(*batch_dims)
    names = [None] * (len(batch_dims) - 1) + ["time"]
    return TensorDict(
        {
            "observation": ids.unsqueeze(-1).expand(*batch_dims, OBS_DIM).float().contiguous(),
            "action": ids.clone(),
            "done": (ids % 2 == 0).unsqueeze(-1),
            "next": {
                "observation": (ids + 1).unsqueeze(-1).expand(*batch_dims, OBS_DIM).float().contiguous(),
                "reward": (ids * 10).unsqueeze(-1).float(),
                "done": (ids % 2 == 1).unsqueeze(-1),
            },
            "collector": {"traj_ids": ids.clone()},
        },
        batch_size=list(batch_dims),
        names=names,  # type: ignore[arg-type]  # None marks an unnamed dim; the stubs forget it
    )


def stored_ids(rb: ReplayBuffer) -> list[int]:
    """The ids of the stored transitions, oldest first."""
    storage = rb.state_dict()["storage"]
    return [] if storage is None else storage["action"].tolist()


def assert_consistent(td: TensorDict) -> None:
    """Every sampled transition's leaves encode one and the same id."""
    ids = td["action"]
    assert torch.equal(td["observation"], ids.unsqueeze(-1).expand(-1, OBS_DIM).float())
    assert torch.equal(td["next", "observation"], (ids + 1).unsqueeze(-1).expand(-1, OBS_DIM).float())
    assert torch.equal(td["next", "reward"], (ids * 10).unsqueeze(-1).float())
    assert torch.equal(td["collector", "traj_ids"], ids)
    assert torch.equal(td["done"], (ids % 2 == 0).unsqueeze(-1))


def test_circular_overwrite_keeps_newest_in_order() -> None:
    rb = ReplayBuffer(10)
    rb.extend(collector_batch(2, 3, start=0))  # ids 0..5
    assert len(rb) == 6
    assert stored_ids(rb) == [0, 1, 2, 3, 4, 5]
    rb.extend(collector_batch(2, 3, start=6))  # ids 6..11, wraps: 0 and 1 overwritten
    assert len(rb) == 10
    assert stored_ids(rb) == list(range(2, 12))
    rb.extend(collector_batch(1, 3, start=12))  # and on: the three oldest go, the order holds
    assert stored_ids(rb) == list(range(5, 15))
    assert set(rb.sample(200, generator=torch.Generator().manual_seed(0))["action"].tolist()) == set(range(5, 15))


def test_batch_larger_than_capacity_keeps_last_capacity() -> None:
    rb = ReplayBuffer(5)
    rb.extend(collector_batch(1, 3, start=0))  # ids 0..2, cursor at 3
    rb.extend(collector_batch(3, 4, start=3))  # 12 ids 3..14, only 10..14 survive
    assert len(rb) == 5
    assert stored_ids(rb) == [10, 11, 12, 13, 14]
    rb.extend(collector_batch(1, 1, start=15))
    assert stored_ids(rb) == [11, 12, 13, 14, 15]


def test_batch_exactly_capacity() -> None:
    rb = ReplayBuffer(6)
    rb.extend(collector_batch(1, 2, start=0))
    rb.extend(collector_batch(2, 3, start=2))
    assert stored_ids(rb) == [2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("batch_dims", [(8,), (3, 5), (2, 3, 4)])
def test_flattens_all_batch_dims_row_major(batch_dims: tuple[int, ...]) -> None:
    rb = ReplayBuffer(100)
    batch = collector_batch(*batch_dims)
    rb.extend(batch)
    n = batch.numel()
    assert len(rb) == n
    assert stored_ids(rb) == list(range(n))
    sample = rb.sample(16)
    assert sample.batch_size == torch.Size([16])
    assert sample["observation"].shape == (16, OBS_DIM)
    assert sample["next", "reward"].shape == (16, 1)
    assert sample["done"].dtype == torch.bool
    assert all(name is None for name in sample.names)
    assert_consistent(sample)


def test_unbatched_td_is_one_transition() -> None:
    rb = ReplayBuffer(3)
    rb.extend(TensorDict({"action": torch.tensor(7)}, batch_size=[]))
    assert len(rb) == 1
    assert rb.sample(2)["action"].tolist() == [7, 7]


def test_nested_keys_are_kept() -> None:
    rb = ReplayBuffer(8)
    batch = TensorDict({"a": {"b": {"c": torch.arange(6).reshape(2, 3)}}, "x": torch.zeros(2, 3, 2)}, [2, 3])
    rb.extend(batch)
    sample = rb.sample(4)
    assert set(sample.keys(include_nested=True, leaves_only=True)) == {("a", "b", "c"), "x"}
    assert sample["a", "b", "c"].shape == (4,)
    assert sample["x"].shape == (4, 2)


def test_all_indices_reachable_with_fixed_generator() -> None:
    rb = ReplayBuffer(10)
    rb.extend(collector_batch(3, 5))  # ids 5..14 kept
    generator = torch.Generator().manual_seed(1234)
    drawn = rb.sample(500, generator=generator)
    assert_consistent(drawn)
    assert set(drawn["action"].tolist()) == set(range(5, 15))


def test_sampling_only_reaches_filled_slots() -> None:
    rb = ReplayBuffer(100)
    rb.extend(collector_batch(1, 3, start=40))
    drawn = rb.sample(300, generator=torch.Generator().manual_seed(0))
    assert set(drawn["action"].tolist()) == {40, 41, 42}


def test_same_generator_seed_gives_same_sample() -> None:
    rb = ReplayBuffer(50)
    rb.extend(collector_batch(5, 10))
    first = rb.sample(20, generator=torch.Generator().manual_seed(7))
    second = rb.sample(20, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first["action"], second["action"])


def test_sample_is_a_copy() -> None:
    rb = ReplayBuffer(4)
    rb.extend(collector_batch(1, 4))
    sample = rb.sample(8, generator=torch.Generator().manual_seed(0))
    before = sample["action"].clone()
    rb.extend(collector_batch(1, 4, start=100))
    assert torch.equal(sample["action"], before)


def test_clear_empties_and_buffer_is_reusable() -> None:
    rb = ReplayBuffer(4)
    rb.extend(collector_batch(1, 3))
    rb.clear()
    assert len(rb) == 0
    with pytest.raises(EmptyBufferError):
        rb.sample(1)
    rb.extend(collector_batch(1, 2, start=50))
    assert stored_ids(rb) == [50, 51]


def test_state_dict_round_trip_preserves_order() -> None:
    rb = ReplayBuffer(5)
    rb.extend(collector_batch(2, 4))  # ids 3..7, wrapped
    state = rb.state_dict()
    restored = ReplayBuffer(8)
    restored.load_state_dict(state)
    assert len(restored) == 5
    assert stored_ids(restored) == [3, 4, 5, 6, 7]
    restored.extend(collector_batch(1, 1, start=8))
    assert stored_ids(restored) == [3, 4, 5, 6, 7, 8]


def test_state_dict_of_fresh_buffer_round_trips() -> None:
    rb = ReplayBuffer(3)
    restored = ReplayBuffer(3)
    restored.load_state_dict(rb.state_dict())
    assert len(restored) == 0


def test_load_state_dict_rejects_too_small_buffer() -> None:
    rb = ReplayBuffer(6)
    rb.extend(collector_batch(1, 6))
    with pytest.raises(ConfigurationError, match=r"state_dict\['size'\]=6.*capacity \(4\)"):
        ReplayBuffer(4).load_state_dict(rb.state_dict())


def test_device_defaults_to_first_batch_device() -> None:
    rb = ReplayBuffer(4)
    assert rb.device is None
    rb.extend(collector_batch(1, 2))
    assert rb.device == torch.device("cpu")
    assert rb.sample(3).device == torch.device("cpu")


def test_explicit_device() -> None:
    rb = ReplayBuffer(4, device="cpu")
    assert rb.device == torch.device("cpu")
    rb.extend(collector_batch(1, 2))
    assert rb.sample(1)["observation"].device == torch.device("cpu")


def test_concurrent_extend_and_sample_threads() -> None:
    """A writer thread and a sampler thread race; every sample must be untorn and the end state exact."""
    capacity, n_batches, envs, steps = 64, 200, 4, 8
    per_batch = envs * steps
    rb = ReplayBuffer(capacity)
    for i in range(2):  # full before the race starts, so len() is fixed from then on
        rb.extend(collector_batch(envs, steps, start=i * per_batch))
    errors: list[BaseException] = []
    writer_done = threading.Event()
    barrier = threading.Barrier(2, timeout=10)

    def writer() -> None:
        try:
            barrier.wait()
            for i in range(2, n_batches):
                rb.extend(collector_batch(envs, steps, start=i * per_batch))
        except BaseException as exc:
            errors.append(exc)
        finally:
            writer_done.set()

    def sampler() -> None:
        try:
            barrier.wait()
            while not writer_done.is_set():
                sample = rb.sample(32)
                assert_consistent(sample)
                assert len(rb) == capacity
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=sampler)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish within 60 s"
    assert not errors, errors
    total = n_batches * per_batch
    assert stored_ids(rb) == list(range(total - capacity, total))


@pytest.mark.parametrize("batch_dims", [(4, 25), (3, 2, 7), (1, 300)])
async def test_aextend_stores_what_extend_stores(batch_dims: tuple[int, ...]) -> None:
    by_extend, by_slices = ReplayBuffer(64), ReplayBuffer(64)
    start = 0
    for _ in range(3):  # past the capacity, and (1, 300) alone larger than it
        batch = collector_batch(*batch_dims, start=start)
        start += batch.numel()
        by_extend.extend(batch)
        await by_slices.aextend(batch, slice_frames=7)
        assert len(by_slices) == len(by_extend)
        assert stored_ids(by_slices) == stored_ids(by_extend)


async def test_aextend_lets_the_loop_run_between_slices_and_samples_stay_whole() -> None:
    """A task sampling while a batch is written in slices: the task runs mid-batch, each row whole."""
    rb = ReplayBuffer(100)
    rb.extend(collector_batch(10, 10, start=0))  # full: the next batch overwrites rows in place
    writing = True
    mid_batch: list[set[int]] = []

    async def sampler() -> None:
        while writing:
            sample = rb.sample(200)
            assert_consistent(sample)
            ids = set(sample["action"].tolist())
            if any(i < 100 for i in ids) and any(i >= 100 for i in ids):
                mid_batch.append(ids)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler)
        await anyio.lowlevel.checkpoint()
        await rb.aextend(collector_batch(10, 10, start=100), slice_frames=10)
        writing = False
    assert mid_batch, "the sampler never ran between two slices of the batch"
    assert stored_ids(rb) == list(range(100, 200))


async def test_cancelled_aextend_still_writes_the_whole_batch() -> None:
    rb = ReplayBuffer(1000)
    with anyio.CancelScope() as scope:
        scope.cancel()  # cancelled before the first slice: every slice is written all the same
        await rb.aextend(collector_batch(4, 50), slice_frames=16)
    assert scope.cancelled_caught
    assert stored_ids(rb) == list(range(200))


async def test_aextend_rejects_a_bad_slice_size() -> None:
    with pytest.raises(ConfigurationError, match="slice_frames"):
        await ReplayBuffer(10).aextend(collector_batch(1, 2), slice_frames=0)


def test_concurrent_extends_from_two_threads_lose_nothing() -> None:
    """Two writers whose batches interleave: every transition lands exactly once."""
    rb = ReplayBuffer(10_000)
    barrier = threading.Barrier(2, timeout=10)

    def writer(offset: int) -> None:
        barrier.wait()
        for i in range(50):
            rb.extend(collector_batch(2, 10, start=offset + i * 20))

    threads = [threading.Thread(target=writer, args=(offset,)) for offset in (0, 1_000_000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert len(rb) == 2000
    ids = stored_ids(rb)
    assert sorted(ids) == list(range(1000)) + list(range(1_000_000, 1_001_000))
    # Each extend is atomic: batches stay contiguous.
    for block in range(0, 2000, 20):
        assert ids[block : block + 20] == list(range(ids[block], ids[block] + 20))


@pytest.mark.parametrize("capacity", [0, -1, 2.5, "10", True, None])
def test_bad_capacity(capacity: object) -> None:
    with pytest.raises(ConfigurationError, match=r"capacity=.*expected a positive int"):
        ReplayBuffer(capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_size", [0, -3, 1.0])
def test_bad_sample_size(batch_size: object) -> None:
    rb = ReplayBuffer(4)
    rb.extend(collector_batch(1, 2))
    with pytest.raises(ConfigurationError, match=r"batch_size=.*expected a positive int"):
        rb.sample(batch_size)  # type: ignore[arg-type]


def test_sample_empty_buffer() -> None:
    rb = ReplayBuffer(4)
    with pytest.raises(EmptyBufferError, match="empty ReplayBuffer"):
        rb.sample(2)
    assert issubclass(EmptyBufferError, AcollectError)
    assert issubclass(EmptyBufferError, IndexError)


def test_mismatched_keys_name_missing_and_extra() -> None:
    rb = ReplayBuffer(10)
    rb.extend(collector_batch(1, 2))
    batch = collector_batch(1, 2)
    del batch["next", "reward"]
    batch["next", "bonus"] = torch.zeros(1, 2, 1)
    with pytest.raises(ConfigurationError, match=r"missing \['next\.reward'\], extra \['next\.bonus'\]"):
        rb.extend(batch)
    assert len(rb) == 2, "a rejected batch must not be partially written"


def test_mismatched_shape_and_dtype() -> None:
    rb = ReplayBuffer(10)
    rb.extend(collector_batch(1, 2))
    wide = collector_batch(1, 2)
    wide["observation"] = torch.zeros(1, 2, OBS_DIM + 1)
    with pytest.raises(ConfigurationError, match=r"batch\['observation'\] per-transition shape=\(5,\)"):
        rb.extend(wide)
    double = collector_batch(1, 2)
    double["next", "reward"] = double["next", "reward"].double()
    with pytest.raises(ConfigurationError, match=r"batch\['next\.reward'\] dtype=torch\.float64"):
        rb.extend(double)


def test_extend_rejects_non_tensordict() -> None:
    rb = ReplayBuffer(4)
    with pytest.raises(ConfigurationError, match="batch='dict' is invalid: expected a TensorDict"):
        rb.extend({"action": torch.zeros(3)})  # type: ignore[arg-type]


def test_extend_rejects_empty_tensordict() -> None:
    with pytest.raises(ConfigurationError, match="at least one tensor leaf"):
        ReplayBuffer(4).extend(TensorDict({}, batch_size=[3]))


@pytest.mark.torchrl
def test_torchrl_replay_buffer_accepts_our_batches() -> None:
    torchrl_data = pytest.importorskip("torchrl.data")
    batch = collector_batch(4, 8)

    # A [n_envs, T] collector batch, stored transition by transition (ndim=2 keeps both dims).
    by_step = torchrl_data.ReplayBuffer(storage=torchrl_data.LazyTensorStorage(64, ndim=2))
    by_step.extend(batch)
    assert len(by_step) == 32
    assert_consistent(by_step.sample(16))

    # Our flattened samples go into a plain 1-dim storage.
    ours = ReplayBuffer(32)
    ours.extend(batch)
    flat = torchrl_data.ReplayBuffer(storage=torchrl_data.LazyTensorStorage(100))
    flat.extend(ours.sample(20))
    assert len(flat) == 20
    assert_consistent(flat.sample(10))


def test_sampling_leaves_next_to_no_cyclic_garbage() -> None:
    # A trainer samples while a collector fills the buffer: garbage in cycles means collections that pause
    # the event loop many times a second.
    import gc

    rb = ReplayBuffer(1000)
    rb.extend(TensorDict({"obs": torch.zeros(500, 4), "next": {"obs": torch.zeros(500, 4)}}, batch_size=[500]))
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            rb.sample(256)
        garbage = gc.collect()
    finally:
        gc.enable()
    assert garbage < 100, f"100 samples left {garbage} objects in reference cycles"
