"""The lender's two roads: plain TensorDicts walked through their own dicts, anything else through tensordict's API.

Both must give the same batch (values, batch sizes and dim names at every node, memory shared with the lent
storage) and return the loan only once the last tensor over the memory is gone.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from tensordict import TensorDict

from acollect._batches.lending import Lender, _plain_leaves


def _slot_like() -> TensorDict:
    """A slot's views: every leaf a view of one byte storage, nested nodes, names, a longer sub batch size."""
    memory = torch.zeros(4096, dtype=torch.uint8)
    obs = memory[0:96].view(torch.float32).view(4, 6)
    action = memory[128:160].view(torch.int64).view(4)
    done = memory[160:164].view(torch.bool).view(4, 1)
    pixels = memory[192:192 + 4 * 3 * 5].view(4, 3, 5)  # fmt: skip
    obs.copy_(torch.arange(24, dtype=torch.float32).view(4, 6))
    action.copy_(torch.tensor([3, 1, 4, 1]))
    done.copy_(torch.tensor([[True], [False], [True], [False]]))
    pixels.copy_(torch.arange(60, dtype=torch.uint8).view(4, 3, 5))
    td = TensorDict(
        {"observation": obs, "action": action, "next": {"done": done, "sub": {"pixels": pixels}}},
        batch_size=[4],
        names=["time"],
    )
    td["next", "sub"].batch_size = [4, 3]
    return td


def _assert_same_tree(lent: TensorDict, source: TensorDict) -> None:
    assert type(lent) is type(source)
    assert lent.batch_size == source.batch_size
    assert lent.names == source.names
    assert set(lent.keys(include_nested=True, leaves_only=True)) == set(
        source.keys(include_nested=True, leaves_only=True)
    )
    for key in source.keys(include_nested=True, leaves_only=True):
        ours, theirs = lent.get(key), source.get(key)
        assert ours.dtype == theirs.dtype
        assert ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
        assert ours.data_ptr() == theirs.data_ptr()  # the same memory, not a copy
    for key in source.keys(include_nested=True):
        if isinstance(source.get(key), TensorDict):
            assert lent.get(key).batch_size == source.get(key).batch_size
            assert lent.get(key).names == source.get(key).names


def test_plain_road_gives_what_the_generic_road_gives() -> None:
    source = _slot_like()
    assert _plain_leaves(source) is not None
    lender = Lender()
    lent = lender.lend(source, token="plain")
    _assert_same_tree(lent, source)
    # Writing through the lent batch writes the slot: it is a view, as the generic road gives.
    lent["next", "sub", "pixels"][0, 0, 0] = 200
    assert int(source["next", "sub", "pixels"][0, 0, 0]) == 200
    sub = lent["next", "sub"]
    del lent
    gc.collect()
    assert lender.returned() == []  # a sub-TensorDict still holds the memory
    del sub
    gc.collect()
    assert lender.returned() == ["plain"]
    assert lender.outstanding == 0
    assert lender.lent_bytes == 0


def test_renaming_a_lent_node_leaves_the_others_alone() -> None:
    source = _slot_like()
    lent = Lender().lend(source, token=0)
    lent.rename_("t")
    assert lent.names == ["t"]
    assert source.names == ["time"]
    assert source["next"].names == ["time"]


def test_anything_but_plain_tensordicts_takes_the_generic_road() -> None:
    source = _slot_like()
    source.set_non_tensor("info", "kept")  # not a tensor: the plain road does not know it
    assert _plain_leaves(source) is None
    lender = Lender()
    lent = lender.lend(source, token="generic")
    assert lent["info"] == "kept"
    assert torch.equal(lent["observation"], source["observation"])
    assert lent["observation"].data_ptr() == source["observation"].data_ptr()
    del lent
    gc.collect()
    assert lender.returned() == ["generic"]


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.float64])
def test_a_storage_seen_as_several_dtypes(dtype: torch.dtype, fixed: bool) -> None:
    memory = torch.zeros(256, dtype=torch.uint8)
    first = memory[0:64].view(dtype)
    second = memory[64:128].view(torch.int64)
    first.copy_(torch.arange(first.numel()).to(dtype))
    second.copy_(torch.arange(8))
    source = TensorDict({"a": first[:8], "b": second[:8]}, batch_size=[8])
    lender = Lender()
    lent = lender.lend(source, token=1, fixed=fixed)
    assert torch.equal(lent["a"], source["a"])
    assert torch.equal(lent["b"], source["b"])
    assert lender.lent_bytes == 256  # one storage, counted once
    del lent
    gc.collect()
    assert lender.returned() == [1]


def test_the_generic_road_stands_in_where_tensordict_internals_are_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    from acollect._batches import lending as _lending

    source = _slot_like()
    monkeypatch.setattr(_lending, "FAST_ASSEMBLY", False)
    assert _plain_leaves(source) is None
    lender = Lender()
    lent = lender.lend(source, token="checked")
    _assert_same_tree(lent, source)
    del lent
    gc.collect()
    assert lender.returned() == ["checked"]


def test_a_fixed_tensordict_is_lent_by_its_plan_as_the_plain_road_lends_it() -> None:
    source = _slot_like()
    lender = Lender()
    first = lender.lend(source, token="first", fixed=True)
    second = lender.lend(source, token="second", fixed=True)
    assert lender.plans_kept == 1, "worked out once, at the first loan"
    for lent in (first, second):
        _assert_same_tree(lent, source)
    del lent
    assert first["observation"] is not second["observation"], "each loan has tensors of its own"
    second["next", "sub", "pixels"][0, 0, 0] = 77  # a view of the slot, as the plain road gives
    assert int(source["next", "sub", "pixels"][0, 0, 0]) == 77
    assert lender.outstanding == 2
    assert lender.lent_bytes == 2 * 4096
    done = first["next", "done"]
    del first
    gc.collect()
    assert lender.returned() == [], "a leaf of the first loan is alive"
    del done
    gc.collect()
    assert lender.returned() == ["first"]
    del second
    gc.collect()
    assert lender.returned() == ["second"]
    assert (lender.outstanding, lender.lent_bytes) == (0, 0)


def test_a_fixed_plan_goes_with_its_tensordict() -> None:
    # The plan holds the TensorDict's own leaves, never longer than the TensorDict: its memory can be unmapped.
    source = _slot_like()
    leaf = weakref.ref(source["observation"])
    lender = Lender()
    lent = lender.lend(source, token=0, fixed=True)
    del lent
    gc.collect()
    assert lender.returned() == [0]
    assert lender.plans_kept == 1
    del source
    gc.collect()
    assert lender.plans_kept == 0
    assert leaf() is None, "nothing keeps the TensorDict's leaves"


def test_a_fixed_tensordict_keeps_its_empty_leaves_and_lends_the_rest() -> None:
    memory = torch.arange(16, dtype=torch.float32)
    source = TensorDict({"x": memory[:8], "nothing": torch.zeros(8, 0)}, batch_size=[8])
    lender = Lender()
    lent = lender.lend(source, token="t", fixed=True)
    assert lent["nothing"] is source["nothing"], "an empty leaf holds no memory: kept as it is"
    assert torch.equal(lent["x"], source["x"])
    assert lent["x"].data_ptr() == source["x"].data_ptr()
    del lent
    gc.collect()
    assert lender.returned() == ["t"]


def test_a_fixed_tensordict_with_nothing_to_hold_comes_back_at_once() -> None:
    source = TensorDict({"nothing": torch.zeros(4, 0)}, batch_size=[4])
    lender = Lender()
    lent = lender.lend(source, token="empty", fixed=True)
    assert lender.returned() == ["empty"]
    assert lent["nothing"] is source["nothing"]


def test_a_fixed_tensordict_that_is_not_plain_takes_the_generic_road() -> None:
    source = _slot_like()
    source.set_non_tensor("info", "kept")
    lender = Lender()
    lent = lender.lend(source, token="generic", fixed=True)
    assert lender.plans_kept == 0
    assert lent["info"] == "kept"
    assert lent["observation"].data_ptr() == source["observation"].data_ptr()
    del lent
    gc.collect()
    assert lender.returned() == ["generic"]
