"""Tensor specs: random samples stay in their domain, zeros have the right shapes, Composite nests, equality."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from acollect.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)

BATCHES = [(), (5,), (3, 4)]


def _specs() -> list[TensorSpec]:
    return [
        Unbounded((2,)),
        Bounded(-1.0, 1.0, (3,)),
        Bounded(torch.tensor([0.0, -5.0]), torch.tensor([1.0, 5.0])),
        Bounded(0, 255, (2, 2), dtype=torch.uint8),
        Bounded(-math.inf, math.inf, (4,)),
        Categorical(3),
        Categorical(4, start=-2),
        OneHot(5),
        MultiCategorical([2, 3, 4]),
        MultiCategorical([2, 3], start=[1, -1]),
        Binary(6),
        Binary((2, 3)),
    ]


@pytest.mark.parametrize("spec", _specs(), ids=repr)
@pytest.mark.parametrize("batch", BATCHES)
def test_rand_has_the_shape_and_dtype_and_stays_in_the_domain(spec: TensorSpec, batch: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        value = spec.rand(batch, generator=gen)
        assert value.shape == (*batch, *spec.shape)
        assert value.dtype == spec.dtype
        assert spec.is_in(value), value


@pytest.mark.parametrize("spec", _specs(), ids=repr)
@pytest.mark.parametrize("batch", BATCHES)
def test_zero_has_the_shape_and_dtype(spec: TensorSpec, batch: tuple[int, ...]) -> None:
    value = spec.zero(batch)
    assert value.shape == (*batch, *spec.shape)
    assert value.dtype == spec.dtype
    assert not value.any()


def test_rand_covers_every_category() -> None:
    gen = torch.Generator().manual_seed(1)
    assert set(Categorical(4, start=-2).rand((400,), generator=gen).tolist()) == {-2, -1, 0, 1}
    mc = MultiCategorical([2, 3], start=[1, -1]).rand((400,), generator=gen)
    assert set(mc[:, 0].tolist()) == {1, 2}
    assert set(mc[:, 1].tolist()) == {-1, 0, 1}
    assert set(OneHot(3).rand((300,), generator=gen).argmax(-1).tolist()) == {0, 1, 2}
    assert set(Bounded(0, 2, (), dtype=torch.int64).rand((300,), generator=gen).tolist()) == {0, 1, 2}


def test_rand_is_reproducible_with_a_generator() -> None:
    spec = Bounded(-2.0, 3.0, (4,))
    a = spec.rand((8,), generator=torch.Generator().manual_seed(7))
    b = spec.rand((8,), generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@settings(max_examples=50, deadline=None)
@given(
    low=st.floats(-1e6, 1e6, allow_nan=False),
    width=st.floats(0.0, 1e6, allow_nan=False),
    n=st.integers(1, 4),
)
def test_bounded_float_rand_in_any_finite_box(low: float, width: float, n: int) -> None:
    spec = Bounded(low, low + width, (n,), dtype=torch.float64)
    assert spec.is_in(spec.rand((16,)))


def test_bounded_with_infinite_bounds_samples_finite_values_inside_the_finite_ones() -> None:
    spec = Bounded(torch.tensor([-math.inf, 0.0]), torch.tensor([math.inf, 1.0]))
    value = spec.rand((200,))
    assert torch.isfinite(value).all()
    assert ((value[:, 1] >= 0) & (value[:, 1] <= 1)).all()


@pytest.mark.parametrize(
    ("spec", "value"),
    [
        (Bounded(-1.0, 1.0, (2,)), torch.tensor([0.0, 1.5])),
        (Bounded(-1.0, 1.0, (2,)), torch.tensor([0.0, 0.5], dtype=torch.float64)),  # wrong dtype
        (Bounded(-1.0, 1.0, (2,)), torch.tensor([0.0, 0.5, 0.1])),  # wrong shape
        (Categorical(3), torch.tensor([3])),
        (Categorical(3, start=1), torch.tensor([0])),
        (OneHot(3), torch.tensor([1, 1, 0])),
        (OneHot(3), torch.tensor([2, -1, 0])),
        (MultiCategorical([2, 2]), torch.tensor([0, 2])),
        (MultiCategorical([2, 2], start=[1, 1]), torch.tensor([0, 1])),
        (Binary(2), torch.tensor([0, 2], dtype=torch.int8)),
    ],
    ids=repr,
)
def test_is_in_rejects_values_outside_the_domain(spec: TensorSpec, value: torch.Tensor) -> None:
    assert not spec.is_in(value)


def test_bounded_infers_shape_and_stores_per_element_bounds() -> None:
    spec = Bounded(torch.zeros(3), 1.0)
    assert spec.shape == (3,)
    assert spec.low.shape == spec.high.shape == (3,)


def test_composite_nests_and_builds_tensordicts() -> None:
    spec = Composite(
        observation=Bounded(-1.0, 1.0, (4,)),
        state=Composite(pos=Unbounded((2,)), grid=Composite(cell=Categorical(3))),
    )
    assert spec.leaf_keys() == [("observation",), ("state", "pos"), ("state", "grid", "cell")]
    assert spec["state", "grid", "cell"] == Categorical(3)
    assert len(spec) == 2
    assert list(spec) == ["observation", "state"]
    zero = spec.zero((3,))
    assert zero.batch_size == (3,)
    assert zero["state", "pos"].shape == (3, 2)
    assert zero["state", "grid", "cell"].shape == (3,)
    rand = spec.rand((2, 5), generator=torch.Generator().manual_seed(0))
    assert rand.batch_size == (2, 5)
    for key, leaf in spec.leaf_items():
        assert leaf.is_in(rand[key])


def test_composite_setitem_and_empty() -> None:
    spec = Composite()
    assert spec.zero((2,)).batch_size == (2,)
    assert len(spec.zero((2,)).keys()) == 0
    spec["x"] = Unbounded((1,))
    assert spec.leaf_keys() == [("x",)]


def test_to_changes_the_device_of_every_leaf_and_keeps_the_original() -> None:
    spec = Composite(a=Unbounded((1,)), b=Composite(c=Categorical(2)))
    moved = spec.to("meta")
    assert moved["b", "c"].device == torch.device("meta")
    assert moved["a"].zero((2,)).device == torch.device("meta")
    assert spec["b", "c"].device == torch.device("cpu")


def test_equality() -> None:
    assert Bounded(-1.0, 1.0, (2,)) == Bounded(-1.0, 1.0, (2,))
    assert Bounded(-1.0, 1.0, (2,)) != Bounded(-1.0, 2.0, (2,))
    assert Bounded(-1.0, 1.0, (2,)) != Bounded(-1.0, 1.0, (2,), dtype=torch.float64)
    assert Categorical(2) != Categorical(3)
    assert Categorical(2) != OneHot(2)
    assert Unbounded((1,)) != Bounded(-1.0, 1.0, (1,))
    assert MultiCategorical([2, 3]) != MultiCategorical([2, 3], start=1)
    assert Composite(a=Categorical(2)) == Composite(a=Categorical(2))
    assert Composite(a=Categorical(2)) != Composite(a=Categorical(3))
    assert Composite(a=Categorical(2)) != Composite(b=Categorical(2))
    assert Unbounded((1,)) != "Unbounded"


def test_specs_are_unhashable_like_other_mutable_values() -> None:
    with pytest.raises(TypeError):
        hash(Unbounded((1,)))
    with pytest.raises(TypeError):
        hash(Composite())


def test_repr_names_the_class_shape_and_domain() -> None:
    assert repr(Categorical(3)) == "Categorical(shape=(), dtype=torch.int64, n=3)"
    assert "low=-1.0" in repr(Bounded(-1.0, 1.0, (2,)))
    assert repr(Composite(a=Unbounded((1,)))) == "Composite(a=Unbounded(shape=(1,), dtype=torch.float32))"
