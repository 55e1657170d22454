"""Tensor specs: the shape, dtype and domain of what an env reads and writes.

Specs describe one env's data *without* batch dimensions; ``zero(batch)`` and
``rand(batch)`` prepend them. The rollout engine allocates its buffers from
specs, and the random policy samples actions from the action spec.

Examples:
    >>> import torch
    >>> from acollect.specs import Bounded, Categorical, Composite
    >>> obs = Composite(observation=Bounded(low=-1.0, high=1.0, shape=(4,)))
    >>> obs.zero((8,))["observation"].shape
    torch.Size([8, 4])
    >>> Categorical(n=2).rand((3,)).shape
    torch.Size([3])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "MultiCategorical",
    "OneHot",
    "TensorSpec",
    "Unbounded",
]


def _size(shape: Sequence[int] | int | torch.Size) -> torch.Size:
    if isinstance(shape, int):
        return torch.Size((shape,))
    return torch.Size(tuple(shape))


class TensorSpec:
    """Shape and dtype of one tensor, without batch dimensions.

    Args:
        shape: the per-env shape.
        dtype: the tensor dtype.
        device: where tensors built from the spec live.
    """

    def __init__(
        self,
        shape: Sequence[int] | int | torch.Size = (),
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.shape = _size(shape)
        self.dtype = dtype
        self.device = torch.device(device)

    def zero(self, batch: Sequence[int] = ()) -> torch.Tensor:
        """A zero tensor of shape ``(*batch, *shape)``."""
        return torch.zeros((*batch, *self.shape), dtype=self.dtype, device=self.device)

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        """A random tensor in the spec's domain, of shape ``(*batch, *shape)``."""
        out = torch.randn((*batch, *self.shape), generator=generator, dtype=torch.float64)
        return out.to(dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        """Whether ``value``'s trailing dims and dtype match the spec."""
        nd = len(self.shape)
        trailing = value.shape[value.ndim - nd :] if nd else torch.Size(())
        return value.dtype == self.dtype and trailing == self.shape and value.ndim >= nd

    def outside(self, value: torch.Tensor) -> torch.Tensor:
        """Which rows of ``value`` (batch dims first, then the spec's shape) hold a value outside the domain.

        Unlike :meth:`is_in` it ignores the dtype, and it says which rows: what an error message names.

        Examples:
            >>> Categorical(n=2).outside(torch.tensor([0, 7, 1])).tolist()
            [False, True, False]
        """
        bad = self._outside(value)
        nd = len(self.shape)
        return bad.flatten(-nd).any(-1) if nd else bad

    def _outside(self, value: torch.Tensor) -> torch.Tensor:
        """Element-wise: ``True`` where ``value`` is outside the domain (no value is, unless a subclass says)."""
        return torch.zeros(value.shape, dtype=torch.bool, device=value.device)

    def to(self, device: torch.device | str) -> TensorSpec:
        """A copy of the spec on ``device``."""
        clone = self._clone()
        clone.device = torch.device(device)
        return clone

    def _clone(self) -> TensorSpec:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._extra_repr()
        extra = f", {extra}" if extra else ""
        return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}{extra})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, TensorSpec)
        return all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
            for a, b in zip(self.__dict__.values(), other.__dict__.values(), strict=True)
        )

    __hash__ = None  # type: ignore[assignment]


class Unbounded(TensorSpec):
    """Any value of the given shape and dtype (sampled from a standard normal)."""


class Bounded(TensorSpec):
    """Values in ``[low, high]`` (element-wise).

    Args:
        low: lower bound (scalar or tensor broadcastable to ``shape``).
        high: upper bound.
        shape: per-env shape; inferred from ``low`` when omitted.
        dtype: tensor dtype.
        device: device of built tensors.
    """

    def __init__(
        self,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
        shape: Sequence[int] | int | torch.Size | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        low_t = torch.as_tensor(low, dtype=torch.float64)
        high_t = torch.as_tensor(high, dtype=torch.float64)
        if shape is None:
            shape = torch.broadcast_shapes(low_t.shape, high_t.shape)
        super().__init__(shape, dtype, device)
        self.low = low_t.expand(self.shape).clone()
        self.high = high_t.expand(self.shape).clone()

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        # Infinite bounds (common in gymnasium Box spaces) fall back to a normal sample there.
        u = torch.rand((*batch, *self.shape), generator=generator, dtype=torch.float64)
        low, high = self.low, self.high
        finite = torch.isfinite(low) & torch.isfinite(high)
        span = torch.where(finite, high - low, torch.ones_like(low))
        base = torch.where(finite, low, torch.zeros_like(low))
        if self.dtype.is_floating_point:
            out = base + u * span
            if not bool(finite.all()):
                normal = torch.randn(out.shape, generator=generator, dtype=torch.float64)
                out = torch.where(finite, out, normal)
        else:
            out = torch.floor(base + u * (span + 1)).clamp(max=high)
        return out.to(dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        if not super().is_in(value):
            return False
        v = value.to(torch.float64)
        return bool(((v >= self.low.to(v.device)) & (v <= self.high.to(v.device))).all())

    def _outside(self, value: torch.Tensor) -> torch.Tensor:
        v = value.to(torch.float64)
        return ~((v >= self.low.to(v.device)) & (v <= self.high.to(v.device)))  # NaN is outside too

    def _extra_repr(self) -> str:
        return f"low={self.low.min().item()}, high={self.high.max().item()}"


class Categorical(TensorSpec):
    """An integer index in ``[0, n)`` (gymnasium ``Discrete``).

    Args:
        n: number of categories.
        shape: per-env shape (``()`` for one index).
        dtype: integer dtype.
        device: device of built tensors.
        start: the smallest value (gymnasium's ``Discrete.start``).
    """

    def __init__(
        self,
        n: int,
        shape: Sequence[int] | int | torch.Size = (),
        dtype: torch.dtype = torch.int64,
        device: torch.device | str = "cpu",
        start: int = 0,
    ) -> None:
        super().__init__(shape, dtype, device)
        self.n = int(n)
        self.start = int(start)

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        # One op where the spec lives on the CPU (the same values as randint(n) + start): a random policy calls it
        # every step, and on a fast env (EnvPool's CartPole) the add and the cast were a few percent of the step.
        size = (*batch, *self.shape)
        if self.device.type == "cpu":
            return torch.randint(self.start, self.start + self.n, size, generator=generator, dtype=self.dtype)
        out = torch.randint(self.n, size, generator=generator) + self.start
        return out.to(dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        if not super().is_in(value):
            return False
        return bool(((value >= self.start) & (value < self.start + self.n)).all())

    def _outside(self, value: torch.Tensor) -> torch.Tensor:
        return ~((value >= self.start) & (value < self.start + self.n))

    def _extra_repr(self) -> str:
        extra = f", start={self.start}" if self.start else ""
        return f"n={self.n}{extra}"


class OneHot(TensorSpec):
    """A one-hot vector of length ``n`` (TorchRL's default encoding of ``Discrete``).

    Args:
        n: number of categories (the last dim).
        dtype: tensor dtype.
        device: device of built tensors.
        shape: the whole per-env shape, ending in ``n``: ``(n_agents, n)`` holds one one-hot vector per agent
            (a group of agents stacks its actions so). ``(n,)`` when omitted.

    Examples:
        >>> OneHot(3, shape=(2, 3)).rand((4,)).sum(-1).tolist()
        [[1, 1], [1, 1], [1, 1], [1, 1]]
    """

    def __init__(
        self,
        n: int,
        dtype: torch.dtype = torch.int64,
        device: torch.device | str = "cpu",
        *,
        shape: Sequence[int] | torch.Size | None = None,
    ) -> None:
        full = (int(n),) if shape is None else tuple(shape)
        if not full or full[-1] != int(n):
            raise ValueError(f"OneHot(n={n}) takes a shape ending in {n}, not {tuple(full)}")
        super().__init__(full, dtype, device)
        self.n = int(n)

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        idx = torch.randint(self.n, (*batch, *self.shape[:-1]), generator=generator)
        return torch.nn.functional.one_hot(idx, self.n).to(dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        if not super().is_in(value):
            return False
        return bool(((value == 0) | (value == 1)).all()) and bool((value.sum(-1) == 1).all())

    def _outside(self, value: torch.Tensor) -> torch.Tensor:
        one_hot = ((value == 0) | (value == 1)).all(-1, keepdim=True) & (value.sum(-1, keepdim=True) == 1)
        return (~one_hot).expand(value.shape)

    def _extra_repr(self) -> str:
        return f"n={self.n}"


class MultiCategorical(TensorSpec):
    """A vector of indices, entry ``i`` in ``[start[i], start[i] + nvec[i])`` (gymnasium ``MultiDiscrete``).

    Args:
        nvec: number of categories of each entry.
        dtype: integer dtype.
        device: device of built tensors.
        start: the smallest value of each entry (gymnasium's ``MultiDiscrete.start``); 0 by default.
    """

    def __init__(
        self,
        nvec: Sequence[int] | torch.Tensor,
        dtype: torch.dtype = torch.int64,
        device: torch.device | str = "cpu",
        start: Sequence[int] | torch.Tensor | int = 0,
    ) -> None:
        nvec_t = torch.as_tensor(nvec, dtype=torch.int64)
        super().__init__(nvec_t.shape, dtype, device)
        self.nvec = nvec_t
        self.start = torch.as_tensor(start, dtype=torch.int64).expand(nvec_t.shape).clone()

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand((*batch, *self.shape), generator=generator, dtype=torch.float64)
        return (torch.floor(u * self.nvec) + self.start).to(dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        if not super().is_in(value):
            return False
        low = self.start.to(value.device)
        return bool(((value >= low) & (value < low + self.nvec.to(value.device))).all())

    def _outside(self, value: torch.Tensor) -> torch.Tensor:
        low = self.start.to(value.device)
        return ~((value >= low) & (value < low + self.nvec.to(value.device)))

    def _extra_repr(self) -> str:
        return f"nvec={self.nvec.tolist()}"


class Binary(TensorSpec):
    """A vector of ``n`` zeros and ones (gymnasium ``MultiBinary``)."""

    def __init__(
        self,
        n: int | Sequence[int],
        dtype: torch.dtype = torch.int8,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(n, dtype, device)

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> torch.Tensor:
        out = torch.randint(2, (*batch, *self.shape), generator=generator)
        return out.to(dtype=self.dtype, device=self.device)

    def is_in(self, value: torch.Tensor) -> bool:
        return super().is_in(value) and bool(((value == 0) | (value == 1)).all())

    def _outside(self, value: torch.Tensor) -> torch.Tensor:
        return ~((value == 0) | (value == 1))


class Composite(Mapping[str, "TensorSpec | Composite"]):
    """A nested mapping of specs: builds TensorDicts.

    Examples:
        >>> from acollect.specs import Composite, Unbounded
        >>> spec = Composite(pixels=Unbounded((3,)), state=Composite(pos=Unbounded((2,))))
        >>> sorted(spec.leaf_keys())
        [('pixels',), ('state', 'pos')]
        >>> spec.zero((4,))["state", "pos"].shape
        torch.Size([4, 2])
    """

    def __init__(self, specs: Mapping[str, TensorSpec | Composite] | None = None, **kwargs: TensorSpec | Composite):
        self._specs: dict[str, TensorSpec | Composite] = dict(specs or {})
        self._specs.update(kwargs)

    def __getitem__(self, key: str | tuple[str, ...]) -> Any:
        if isinstance(key, tuple):
            node: Any = self
            for k in key:
                node = node[k]
            return node
        return self._specs[key]

    def __setitem__(self, key: str, value: TensorSpec | Composite) -> None:
        self._specs[key] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def leaf_items(self, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], TensorSpec]]:
        """Yields ``(key_tuple, leaf_spec)`` for every leaf, depth first."""
        for name, spec in self._specs.items():
            if isinstance(spec, Composite):
                yield from spec.leaf_items((*prefix, name))
            else:
                yield (*prefix, name), spec

    def leaf_keys(self) -> list[tuple[str, ...]]:
        """Every leaf key as a tuple."""
        return [k for k, _ in self.leaf_items()]

    def zero(self, batch: Sequence[int] = ()) -> TensorDict:
        """A TensorDict of zeros with batch size ``batch``."""
        return self._build(batch, lambda s: s.zero(batch))

    def rand(self, batch: Sequence[int] = (), generator: torch.Generator | None = None) -> TensorDict:
        """A TensorDict of random values with batch size ``batch``."""
        return self._build(batch, lambda s: s.rand(batch, generator))

    def _build(self, batch: Sequence[int], fn: Any) -> TensorDict:
        td = TensorDict({}, batch_size=tuple(batch))
        for key, spec in self.leaf_items():
            td.set(key, fn(spec))
        return td

    def to(self, device: torch.device | str) -> Composite:
        """A copy of the spec with every leaf on ``device``."""
        return Composite({k: v.to(device) for k, v in self._specs.items()})

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._specs.items())
        return f"Composite({inner})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Composite):
            return NotImplemented
        return self._specs == other._specs

    __hash__ = None  # type: ignore[assignment]
