"""What a worker collector lends: its batches' shared memory, handed out as it is and given back once dropped.

Every batch of a worker collector lies in shared memory a worker wrote (its slot, or its rows of a lockstep
segment). By default the collector hands that memory out (:class:`~acollect.transport.loans.Lender`: no copy) and
gives it back to its worker when the caller drops the last tensor over it; meanwhile the worker writes into other
slots, and gets new ones while the lent memory stays within ``max_lent_bytes``. Beyond that budget a batch is
handed out as a copy and its memory given back at once: a caller keeping every batch never stalls collection, and
the shared memory stays bounded. :class:`Loans` keeps the books: what is lent, by whom, and within which budget;
the dispatch strategies (:mod:`acollect.collectors.dispatch`) decide which memory a batch is and how a worker gets
it back.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> loans = Loans(budget=1 << 20)
    >>> batch = loans.lend(TensorDict({"x": torch.zeros(8)}, batch_size=[8]), key=("w", 0), token=3)
    >>> loans.held(("w", 0)), loans.lent_bytes
    (1, 32)
    >>> del batch
    >>> loans.returned()
    [(('w', 0), 3)]
    >>> loans.held(("w", 0))
    0
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Hashable
from typing import cast

from tensordict import TensorDictBase

from acollect.transport.loans import Lender
from acollect.transport.shm import SHM_DIR

__all__ = ["DEFAULT_LENT_BYTES", "Loans", "default_budget"]

#: The most shared memory lent at once, by default: beyond it batches are copies (see default_budget).
DEFAULT_LENT_BYTES = 1 << 30


def default_budget() -> int:
    """:data:`DEFAULT_LENT_BYTES`, or a quarter of ``/dev/shm`` where that is less (a container's is often small)."""
    try:
        total = shutil.disk_usage(SHM_DIR).total
    except OSError:
        return DEFAULT_LENT_BYTES
    return max(1, min(DEFAULT_LENT_BYTES, total // 4))


class Loans:
    """The books of a collector's lent batches: how many each memory owner has out, and the budget.

    Args:
        budget: the most bytes lent at once (beyond it the collector hands out copies).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.lender = Lender()
        self._held: Counter[Hashable] = Counter()
        #: batches handed out as copies because lending them would have passed the budget
        self.over_budget = 0
        #: batches lent so far
        self.lent_batches = 0

    @property
    def lent_bytes(self) -> int:
        """Shared memory lent now (bytes)."""
        return self.lender.lent_bytes

    @property
    def outstanding(self) -> int:
        """Batches lent and not given back yet."""
        return self.lender.outstanding

    def room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be lent; counts a refusal (the batch is then a copy)."""
        if self.lender.lent_bytes + nbytes <= self.budget:
            return True
        self.over_budget += 1
        return False

    def held(self, key: Hashable) -> int:
        """Loans out from the memory owner ``key`` (a worker's incarnation, or the lockstep segments)."""
        return self._held[key]

    def lend(self, td: TensorDictBase, *, key: Hashable, token: Hashable) -> TensorDictBase:
        """``td`` lent (new tensors over its memory); ``(key, token)`` comes back from :meth:`returned` once dropped."""
        self._held[key] += 1
        self.lent_batches += 1
        return self.lender.lend(td, (key, token))

    def returned(self) -> list[tuple[Hashable, Hashable]]:
        """``(key, token)`` of every loan given back since the last call."""
        back: list[tuple[Hashable, Hashable]] = []
        for returned in self.lender.returned():
            key, token = cast(tuple[Hashable, Hashable], returned)
            self._held[key] -= 1
            back.append((key, token))
        return back
