"""Shared-memory slots across real processes, and nothing left behind in /dev/shm."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from acollect._batches.shm import (
    SHM_DIR,
    ShmSegment,
    ShmTensorDictSlot,
    cleanup_stale,
    shm_available,
)
from acollect._batches.slot_ring import ShmSlotRing
from acollect._runtime.wire import encode_tensordict
from acollect.errors import ConfigurationError, TransportError
from acollect.testing import our_segments

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="shared memory slots need /dev/shm")

JOIN_TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def no_segment_leaks():  # type: ignore[no-untyped-def]
    before = our_segments()
    yield
    gc.collect()
    assert our_segments() == before


def batch(seed: int) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "pixels": torch.randint(0, 256, (2, 5, 4, 8, 8), dtype=torch.uint8, generator=generator),
            "action": torch.randint(0, 3, (2, 5), generator=generator),
            ("next", "reward"): torch.randn(2, 5, 1, generator=generator),
            ("next", "done"): torch.rand(2, 5, 1, generator=generator) > 0.5,
            "scalar_per_env": torch.randn(2, 5, generator=generator).to(torch.bfloat16),
        },
        batch_size=[2, 5],
        names=[None, "time"],
    )


def run_in_child(target: Any, *args: Any) -> None:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join(JOIN_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(JOIN_TIMEOUT)
        pytest.fail(f"child {target.__name__} did not finish within {JOIN_TIMEOUT}s")
    assert process.exitcode == 0, f"child {target.__name__} exited with {process.exitcode}"


def child_reads_then_writes(names: list[str], layout: dict[str, Any], seed: int) -> None:
    with ShmSlotRing.attach(names, layout) as ring:
        received = ring[0].read()
        if not (received == batch(seed)).all():
            raise SystemExit(3)
        ring[1].write(batch(seed + 1))


def child_creates_and_dies(name_out: Any) -> None:
    segment = ShmSegment.create(128)
    name_out.send(segment.name)
    name_out.close()
    os._exit(0)  # dies without unlinking, as a killed owner would


def test_shm_is_available_on_linux() -> None:
    assert shm_available()


def test_slot_ring_between_two_processes() -> None:
    layout, _ = encode_tensordict(batch(0))
    with ShmSlotRing.create(layout, 2) as ring:
        assert ring.names[0] in os.listdir(SHM_DIR)
        ring[0].write(batch(10))
        run_in_child(child_reads_then_writes, ring.names, ring.layout, 10)
        answer = ring[1].read()
        assert (answer == batch(11)).all()
        assert answer.names == [None, "time"]
        names = ring.names
    assert not set(names) & set(os.listdir(SHM_DIR))


def test_cleanup_stale_removes_segments_of_dead_owners_only() -> None:
    receiver, sender = multiprocessing.get_context("spawn").Pipe(duplex=False)
    run_in_child(child_creates_and_dies, sender)
    assert receiver.poll(JOIN_TIMEOUT)
    orphan = receiver.recv()
    assert orphan in os.listdir(SHM_DIR)
    with ShmSegment.create(8) as alive:
        removed = cleanup_stale()
        assert orphan in removed
        assert alive.name not in removed
        assert alive.name in os.listdir(SHM_DIR)
    assert orphan not in os.listdir(SHM_DIR)


def test_segment_create_attach_share_memory() -> None:
    with ShmSegment.create(100) as owner, ShmSegment.attach(owner.name, 100) as other:
        assert owner.owner
        assert not other.owner
        owner.tensor()[:] = torch.arange(100, dtype=torch.uint8)
        assert bytes(other.buffer) == bytes(range(100))
        other.buffer[0] = 200
        assert owner.tensor()[0] == 200


def test_close_and_unlink_are_idempotent_and_leave_nothing() -> None:
    segment = ShmSegment.create(64)
    path = segment.path
    segment.close()
    segment.close()
    assert segment.closed
    assert os.path.exists(path)  # closing unmaps; only unlink removes the name
    segment.unlink()
    segment.unlink()
    assert not os.path.exists(path)
    with pytest.raises(TransportError, match="closed"):
        segment.tensor()


def test_attach_errors_are_clear() -> None:
    missing = f"acollect-{os.getpid()}-{'0' * 16}"
    with pytest.raises(TransportError, match="does not exist"):
        ShmSegment.attach(missing, 8)
    with pytest.raises(ConfigurationError, match=r"name='\.\./etc/passwd'"):
        ShmSegment.attach("../etc/passwd", 8)
    with ShmSegment.create(8) as owner:
        with pytest.raises(TransportError, match="has 8 bytes, 1024 were expected"):
            ShmSegment.attach(owner.name, 1024)
        with ShmSegment.attach(owner.name, 8) as other, pytest.raises(TransportError, match="only the owner"):
            other.unlink()
    with pytest.raises(ConfigurationError, match="size=-1"):
        ShmSegment.create(-1)


def test_closing_with_live_views_keeps_them_valid() -> None:
    segment = ShmSegment.create(16)
    view = segment.tensor()
    view[:] = 9
    segment.close()
    segment.unlink()
    assert int(view.sum()) == 9 * 16  # still mapped: the mapping goes when the view does
    del view


def test_owner_that_is_collected_unlinks() -> None:
    segment = ShmSegment.create(16)
    path = segment.path
    del segment
    gc.collect()
    assert not os.path.exists(path)


def test_slot_read_copies_by_default() -> None:
    td = batch(1)
    with ShmTensorDictSlot.create(encode_tensordict(td)[0]) as slot:
        slot.write(td)
        copied, live = slot.read(), slot.read(copy=False)
        slot.write(batch(2))
        assert (copied == td).all()
        assert (live == batch(2)).all()
        slot.tensordict["action"].fill_(7)  # the rollout can fill the slot in place
        assert bool((slot.read()["action"] == 7).all())


def test_slot_write_rejects_other_layouts() -> None:
    td = batch(1)
    with ShmTensorDictSlot.create(encode_tensordict(td)[0]) as slot:
        with pytest.raises(ConfigurationError, match=r"td\[\('action',\)\]='torch.float32"):
            slot.write(td.clone().set("action", torch.zeros(2, 5)))
        with pytest.raises(ConfigurationError, match="exactly the slot's keys"):
            slot.write(td.clone().set("extra", torch.zeros(2, 5)))
    with pytest.raises(TransportError, match="closed"):
        slot.write(td)


def test_empty_and_zero_sized_layouts() -> None:
    td = TensorDict({"none": torch.empty(3, 0)}, batch_size=[3])
    with ShmTensorDictSlot.create(encode_tensordict(td)[0]) as slot:
        slot.write(td)
        assert slot.read()["none"].shape == (3, 0)


def test_ring_credits() -> None:
    layout, _ = encode_tensordict(batch(0))
    with ShmSlotRing.create(layout, 3) as ring:
        assert [ring.acquire(), ring.acquire(), ring.acquire(), ring.acquire()] == [0, 1, 2, None]
        ring.release(1)
        assert ring.n_free == 1
        assert ring.acquire() == 1
        with pytest.raises(ConfigurationError, match="index=5"):
            ring.release(5)
        ring.release(0)
        with pytest.raises(ConfigurationError, match="index=0"):
            ring.release(0)
    with pytest.raises(ConfigurationError, match="n_slots=0"):
        ShmSlotRing.create(layout, 0)
