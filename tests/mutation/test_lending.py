"""Lent shared memory (:mod:`acollect._batches.lending`): the loans, byte for byte and loan for loan.

Each test kills mutants that ``tools/mutation.py lending`` found alive: a loan given back while a region of it is
still held, bytes counted twice or not at all, a budget off by one, a wake-up that breaks the return.
"""

from __future__ import annotations

import gc
import shutil

import pytest
import torch
from tensordict import TensorDict

from acollect._batches.lending import DEFAULT_LENT_BYTES, Lender, Loans, default_budget
from acollect._batches.shm import SHM_DIR


def two_storages() -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    """A batch over two storages (100 and 24 bytes), a float view and an int view of the first."""
    first = torch.zeros(100, dtype=torch.uint8)
    second = torch.zeros(24, dtype=torch.uint8)
    obs = first[:32].view(torch.float32).view(2, 4)
    obs.copy_(torch.arange(8, dtype=torch.float32).view(2, 4))
    steps = first[32:48].view(torch.int64)
    steps.copy_(torch.tensor([7, 9]))
    reward = second[:8].view(torch.float32)
    reward.copy_(torch.tensor([0.5, 1.5]))
    td = TensorDict({"observation": obs, "steps": steps, "next": {"reward": reward}}, batch_size=[2])
    return td, first, second


class NotPlain(TensorDict):
    """A TensorDict subclass: lent through tensordict's API, not walked through its dicts."""


WAYS = ["plain", "generic", "fixed"]


def lent_as(td: TensorDict, way: str) -> TensorDict:
    """``td`` as it is lent: a plain TensorDict, or one that is not (the generic way)."""
    return NotPlain(td.to_dict(), batch_size=td.batch_size) if way == "generic" else td


@pytest.mark.parametrize("way", WAYS)
def test_a_loan_over_two_storages_comes_back_once_both_are_dropped(way: str) -> None:
    td, first, second = two_storages()
    td = lent_as(td, way)
    woken: list[int] = []
    lender = Lender(wake=lambda: woken.append(1))
    lent = lender.lend(td, token="a", fixed=way == "fixed")
    assert (lender.lent_bytes, lender.outstanding) == (124, 1)
    assert lent["observation"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lent["steps"].tolist() == [7, 9]
    assert lent["next", "reward"].tolist() == [0.5, 1.5]
    assert lent["observation"].data_ptr() == first.data_ptr()
    assert lent["next", "reward"].data_ptr() == second.data_ptr()
    reward = lent["next", "reward"]
    steps = lent["steps"]
    del lent
    gc.collect()
    assert lender.returned() == []
    assert woken == []
    del steps
    gc.collect()
    assert lender.returned() == []
    assert woken == []
    del reward
    gc.collect()
    assert (lender.returned(), woken) == (["a"], [1])
    assert (lender.lent_bytes, lender.outstanding) == (0, 0)
    assert lender.returned() == []  # each token once


@pytest.mark.parametrize("way", WAYS)
def test_two_loans_are_booked_apart_and_come_back_in_the_order_they_are_dropped(way: str) -> None:
    lender = Lender()
    td_a, _, _ = two_storages()
    td_a = lent_as(td_a, way)
    td_b = lent_as(TensorDict({"x": torch.zeros(16, dtype=torch.int32)}, batch_size=[16]), way)
    lent_a = lender.lend(td_a, token=1, fixed=way == "fixed")
    lent_b = lender.lend(td_b, token=2, fixed=way == "fixed")
    assert (lender.lent_bytes, lender.outstanding) == (124 + 64, 2)
    del lent_b
    gc.collect()
    assert (lender.returned(), lender.lent_bytes, lender.outstanding) == ([2], 124, 1)
    del lent_a
    gc.collect()
    assert (lender.returned(), lender.lent_bytes, lender.outstanding) == ([1], 0, 0)


@pytest.mark.parametrize("way", WAYS)
def test_a_batch_with_nothing_to_hold_is_handed_as_it_is_and_back_at_once(way: str) -> None:
    woken: list[int] = []
    lender = Lender(wake=lambda: woken.append(1))
    td = lent_as(TensorDict({"empty": torch.zeros(0, 3)}, batch_size=[0]), way)
    lent = lender.lend(td, token="nothing", fixed=way == "fixed")
    assert lent["empty"].shape == (0, 3)
    assert (lender.returned(), woken, lender.lent_bytes, lender.outstanding) == (["nothing"], [1], 0, 0)


@pytest.mark.parametrize("way", WAYS)
def test_empty_leaves_beside_lent_ones_are_kept_as_they_are_and_hold_nothing(way: str) -> None:
    lender = Lender()
    empty = torch.zeros(0, 2)
    memory = torch.arange(6, dtype=torch.int64)
    td = lent_as(TensorDict({"empty": empty, "x": memory}, batch_size=[]), way)
    lent = lender.lend(td, token=0, fixed=way == "fixed")
    assert lent["empty"].shape == (0, 2)
    assert lent["x"].tolist() == [0, 1, 2, 3, 4, 5]
    assert lender.lent_bytes == 48
    kept = lent["empty"]
    del lent
    gc.collect()
    assert lender.returned() == [0]  # the empty leaf holds no memory
    assert kept.shape == (0, 2)


def test_a_storage_seen_as_a_wider_dtype_than_its_length_allows() -> None:
    memory = torch.arange(12, dtype=torch.uint8)  # 12 bytes: one int64 and a 4-byte tail
    td = TensorDict({"x": memory[:8].view(torch.int64), "tail": memory[8:]}, batch_size=[])
    for fixed in (False, True):
        lender = Lender()
        lent = lender.lend(td, token=0, fixed=fixed)
        assert lent["x"].tolist() == memory[:8].view(torch.int64).tolist()
        assert lent["tail"].tolist() == [8, 9, 10, 11]
        assert lender.lent_bytes == 12


def test_a_wake_up_that_fails_loses_no_token() -> None:
    def wake() -> None:
        raise RuntimeError("the loop is closed")

    lender = Lender(wake=wake)
    lent = lender.lend(TensorDict({"x": torch.zeros(4)}, batch_size=[4]), token="kept")
    del lent
    gc.collect()
    assert lender.returned() == ["kept"]


def test_a_fixed_tensordicts_plan_is_kept_while_it_lives_and_reused() -> None:
    lender = Lender()
    td, _, _ = two_storages()
    for token in range(3):
        lent = lender.lend(td, token=token, fixed=True)
        assert lender.plans_kept == 1
        assert lent["steps"].tolist() == [7, 9]
        del lent
        gc.collect()
        assert lender.returned() == [token]
    other, _, _ = two_storages()
    lent = lender.lend(other, token=9, fixed=True)
    assert lender.plans_kept == 2
    del lent, td
    gc.collect()
    assert lender.plans_kept == 1
    assert lender.returned() == [9]


def test_the_default_budget_is_a_gib_or_a_quarter_of_dev_shm() -> None:
    try:
        total = shutil.disk_usage(SHM_DIR).total
    except OSError:
        assert default_budget() == DEFAULT_LENT_BYTES
        return
    assert default_budget() == max(1, min(1 << 30, total // 4))
    assert DEFAULT_LENT_BYTES == 1 << 30


def test_the_books_count_what_each_owner_has_out_and_refuse_past_the_budget() -> None:
    loans = Loans(budget=100)
    assert (loans.budget, loans.over_budget, loans.lent_batches) == (100, 0, 0)
    assert (loans.lent_bytes, loans.outstanding) == (0, 0)
    assert loans.room_for(100)  # up to the budget, included
    a = loans.lend(TensorDict({"x": torch.zeros(15)}, batch_size=[15]), key=("w", 0), token=1)  # 60 bytes
    fixed = TensorDict({"x": torch.zeros(5)}, batch_size=[5])
    b = loans.lend(fixed, key=("w", 0), token=2, fixed=True)
    assert loans.lender.plans_kept == 1
    c = loans.lend(TensorDict({"x": torch.zeros(2)}, batch_size=[2]), key="shared", token=3)
    assert (loans.held(("w", 0)), loans.held("shared"), loans.held(("w", 1))) == (2, 1, 0)
    assert (loans.lent_batches, loans.lent_bytes, loans.outstanding) == (3, 88, 3)
    assert loans.room_for(12)
    assert loans.over_budget == 0
    assert not loans.room_for(13)
    assert not loans.room_for(100)
    assert loans.over_budget == 2
    del b
    gc.collect()
    assert loans.returned() == [(("w", 0), 2)]
    assert (loans.held(("w", 0)), loans.lent_bytes, loans.outstanding) == (1, 68, 2)
    del a
    gc.collect()
    assert loans.returned() == [(("w", 0), 1)]
    del c
    gc.collect()
    assert loans.returned() == [("shared", 3)]
    assert (loans.held(("w", 0)), loans.held("shared"), loans.lent_bytes) == (0, 0, 0)


def test_a_fixed_tensordict_is_lent_by_the_plan_of_its_first_loan() -> None:
    lender = Lender()
    first = torch.arange(4)
    td = TensorDict({"x": first}, batch_size=[4])
    lent = lender.lend(td, token=0, fixed=True)
    del lent
    td["x"] = torch.arange(4) + 10  # a fixed TensorDict's leaves never change: its plan still lends the first ones
    lent = lender.lend(td, token=1, fixed=True)
    assert lent["x"].tolist() == [0, 1, 2, 3]
    assert lent["x"].data_ptr() == first.data_ptr()
    assert lender.lend(td, token=2)["x"].tolist() == [10, 11, 12, 13]  # not fixed: as it is now


@pytest.mark.parametrize("fixed", [False, True])
def test_storages_of_odd_lengths_are_lent_whole(fixed: bool) -> None:
    thirteen = torch.arange(13, dtype=torch.uint8)  # no whole number of any wider dtype
    nine = torch.arange(100, 109, dtype=torch.uint8)
    td = TensorDict({"bytes": thirteen, "long": nine[:8].view(torch.int64)}, batch_size=[])
    lender = Lender()
    lent = lender.lend(td, token=0, fixed=fixed)
    assert lent["bytes"].tolist() == list(range(13))
    assert lent["long"].tolist() == nine[:8].view(torch.int64).tolist()
    assert lender.lent_bytes == 22


def test_a_batch_not_said_fixed_keeps_no_plan() -> None:
    loans = Loans(budget=1 << 20)
    td = TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    lent = loans.lend(td, key="w", token=0)
    assert loans.lender.plans_kept == 0
    assert lent["x"].data_ptr() == td["x"].data_ptr()


@pytest.mark.parametrize("way", WAYS)
def test_an_empty_node_is_lent_as_it_is(way: str) -> None:
    td = TensorDict({"x": torch.arange(3), "meta": TensorDict({}, batch_size=[3])}, batch_size=[3])
    lent = Lender().lend(lent_as(td, way), token=0, fixed=way == "fixed")
    assert set(lent.keys()) == {"x", "meta"}
    assert lent["meta"].batch_size == torch.Size([3])
