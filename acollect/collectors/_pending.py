"""What a worker collector was asked to change and has not applied yet: a seed, saved counters, weights.

``set_seed`` and ``load_state_dict`` return at once; what they ask reaches the workers at the next batch boundary.
:class:`PendingChanges` holds it meanwhile, as one of the collector's parts: the collector stages a change
(``stage_*``) and takes it to apply it (``take_*``); nobody else writes it.

Examples:
    >>> pending = PendingChanges()
    >>> pending.stage_seed(7)
    >>> pending.seed, pending.take_seed(), pending.seed
    (7, 7, None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

__all__ = ["PendingChanges"]


class PendingChanges:
    """A seed, the workers' saved counters and weights, each waiting for the next batch boundary."""

    __slots__ = ("_seed", "_state", "_weights")

    def __init__(self) -> None:
        self._seed: int | None = None
        self._state: list[dict[str, Any]] | None = None
        self._weights: TensorDictBase | None = None

    @property
    def seed(self) -> int | None:
        """The seed staged (``None``: none)."""
        return self._seed

    @property
    def state(self) -> list[dict[str, Any]] | None:
        """The workers' counters staged by ``load_state_dict`` (one dict per worker; ``None``: none)."""
        return self._state

    def stage_seed(self, seed: int) -> None:
        """``seed`` applies at the next batch boundary (the last one staged wins)."""
        self._seed = seed

    def stage_state(self, workers: Sequence[Mapping[str, Any]]) -> None:
        """The workers' saved counters apply at the next batch boundary."""
        self._state = [dict(w) for w in workers]

    def stage_weights(self, weights: TensorDictBase) -> None:
        """Saved weights are pushed at the next batch boundary."""
        self._weights = weights

    def take_seed(self) -> int | None:
        """The seed staged, now no longer pending."""
        seed, self._seed = self._seed, None
        return seed

    def take_state(self) -> list[dict[str, Any]] | None:
        """The counters staged, now no longer pending."""
        state, self._state = self._state, None
        return state

    def take_weights(self) -> TensorDictBase | None:
        """The weights staged, now no longer pending."""
        weights, self._weights = self._weights, None
        return weights
