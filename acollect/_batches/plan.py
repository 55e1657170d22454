"""What each batch holds: the batch-size plan, settled once, asked by every layer of a collector.

A collector is asked for ``frames_per_batch`` frames a batch. Each worker (the in-process collector counts as one)
collects its share (all of it where a batch is one worker's frames; ``ceil(frames_per_batch / n_workers)`` where
a lockstep batch holds every worker's), rounded up to a multiple of its number of envs: every env steps equally
often, as in TorchRL.

:class:`BatchPlan` holds that rule (:meth:`BatchPlan.time_steps`) and its outcome. The collector makes it at
construction and workers' configs take their share from it; a worker's engine builder asks a plan of that share how
many steps each of its envs takes once its envs are built (:mod:`acollect._rollout.build`: the engines are given
that number, and round nothing). The collector's plan settles once every worker's number of envs is known: from
the arguments already (a gymnasium id and its ``num_envs``), else from what the workers report as they start.
Until then it says what was asked. It warns once, where what a batch holds is not what was asked.

It lives with the rollout engines, below the workers and the collectors, so that both ask the same object.

Examples:
    >>> plan = BatchPlan(2048, n_workers=2, stacked=True)
    >>> plan.per_worker, plan.frames_per_batch, plan.settled
    (1024, 2048, False)
    >>> plan.settle([16, 16])
    False
    >>> plan.frames_per_batch, plan.settled
    (2048, True)
    >>> BatchPlan(100).time_steps(8)  # a worker of 8 envs asked for 100 frames steps each env 13 times
    13
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from acollect._warnings import warn

__all__ = ["BatchPlan"]


class BatchPlan:
    """The frames asked for, each worker's share, and what each batch holds once the envs are known.

    Args:
        requested: the ``frames_per_batch`` given.
        n_workers: how many workers collect (1 for the in-process collector).
        stacked: a batch holds every worker's frames (lockstep, ``MultiSyncCollector``), else one worker's.
    """

    __slots__ = ("_settled", "n_workers", "requested", "stacked")

    def __init__(self, requested: int, *, n_workers: int = 1, stacked: bool = False) -> None:
        self.requested = requested
        self.n_workers = n_workers
        self.stacked = stacked
        self._settled: int | None = None  # what each batch holds, once every worker's envs are known

    @property
    def per_worker(self) -> int:
        """Frames each worker is asked for per batch it sends (its share of what was *requested*: a share of an
        already rounded total would round twice where workers have different numbers of envs)."""
        return math.ceil(self.requested / self.n_workers) if self.stacked else self.requested

    def time_steps(self, n_envs: int) -> int:
        """The steps each env of a worker of ``n_envs`` envs takes per batch it sends: its share rounded up to a
        multiple of ``n_envs``, divided by ``n_envs`` (the one rule: every env steps equally often)."""
        return math.ceil(self.per_worker / n_envs)

    @property
    def frames_per_batch(self) -> int:
        """What each batch holds (the largest worker's, where batches are one worker's and workers differ); what
        was asked until :meth:`settle`."""
        return self._settled if self._settled is not None else self.requested

    @property
    def settled(self) -> bool:
        """Whether every worker's number of envs is known, and so what each batch holds."""
        return self._settled is not None

    def settle(self, n_envs: Sequence[int | None]) -> bool:
        """Settles what each batch holds from each worker's number of envs (``None``: not known yet, and nothing
        settles); warns where it is not what was asked. Once settled, later calls change nothing.

        Returns:
            Whether :attr:`frames_per_batch` changed.
        """
        if self._settled is not None or any(n is None for n in n_envs) or len(n_envs) != self.n_workers:
            return False
        counts = [int(n) for n in n_envs if n is not None]
        sizes = [n * self.time_steps(n) for n in counts]
        actual = sum(sizes) if self.stacked else max(sizes)
        self._settled = actual
        if actual == self.requested:
            return False
        self._warn(counts, sizes, actual)
        return True

    def _warn(self, counts: list[int], sizes: list[int], actual: int) -> None:
        if len(counts) == 1:
            envs = f"{counts[0]}"
        elif len(set(counts)) == 1:
            envs = f"{len(counts)} workers x {counts[0]} envs" if self.stacked else f"{counts[0]} per worker"
        else:
            envs = f"per worker: {counts}"
        holds = (
            f"each batch holds {actual} frames"
            if self.stacked or len(set(sizes)) == 1
            else f"a batch holds one worker's {sizes} frames (collector.frames_per_batch says the largest)"
        )
        warn(
            f"frames_per_batch={self.requested} is not a multiple of the number of envs ({envs}): {holds}, rounded "
            f"up so that every env steps equally often; collector.frames_per_batch is now {actual}."
        )
