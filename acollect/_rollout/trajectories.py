"""Each env's trajectory (its id and length so far), and the ids handed out: unique across workers and restarts.

Both rollout engines keep one :class:`Trajectories`: worker ``k`` of ``n`` hands out the ids ``k, k + n, ...``
(``offset`` and ``stride``), and the count handed out is saved in state dicts, so a restored or restarted engine
never hands out an id twice.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Trajectories"]


class Trajectories:
    """The trajectory of each env (its id and length so far), and how many ids were handed out.

    Args:
        n_envs: how many envs.
        offset: the first id; with ``stride`` it keeps the ids of workers apart.
        stride: the step between consecutive ids.

    Examples:
        >>> trajectories = Trajectories(2, offset=1, stride=4)  # worker 1 of 4
        >>> trajectories.start_all()
        >>> trajectories.ids.tolist(), trajectories.new_id(), trajectories.counter
        ([1, 5], 9, 3)
    """

    def __init__(self, n_envs: int, offset: int, stride: int) -> None:
        self.offset, self.stride = offset, stride
        #: how many ids were handed out
        self.counter = 0
        #: each env's trajectory id
        self.ids = np.zeros(n_envs, dtype=np.int64)
        #: each env's steps in its trajectory so far
        self.lengths = np.zeros(n_envs, dtype=np.int64)

    def new_id(self) -> int:
        """Hands out the next id."""
        self.counter += 1
        return self.offset + self.stride * (self.counter - 1)

    def new_ids(self, count: int) -> np.ndarray:
        """Hands out the next ``count`` ids at once."""
        start = self.counter
        self.counter += count
        return self.offset + self.stride * np.arange(start, start + count, dtype=np.int64)

    def start_all(self) -> None:
        """Every env begins a new trajectory (after a reset of all)."""
        self.ids[:] = self.new_ids(len(self.ids))
        self.lengths[:] = 0
