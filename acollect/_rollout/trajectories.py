"""Each env's trajectory (its id and length so far), the ids handed out (unique across workers and restarts), and
the limit on a trajectory's length.

Both rollout engines keep one :class:`Trajectories`, made by their spec
(:meth:`~acollect._rollout.spec.RolloutSpec.trajectories`): worker ``k`` of ``n`` hands out the ids ``k, k + n, ...``
(``offset`` and ``stride``), and the count handed out is saved in state dicts, so a restored or restarted engine
never hands out an id twice. The limit is applied here alone (:meth:`Trajectories.count_step`), so that both
engines cut a trajectory at the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

__all__ = ["Trajectories"]

_EVERY_ENV = slice(None)


class Trajectories:
    """The trajectory of each env (its id and length so far), how many ids were handed out, and the length limit.

    Args:
        n_envs: how many envs.
        offset: the first id; with ``stride`` it keeps the ids of workers apart.
        stride: the step between consecutive ids.
        max_length: the most steps a trajectory holds: the step that reaches it ends the trajectory (truncated,
            unless the episode ended with it anyway); ``None``: no limit.

    Examples:
        >>> trajectories = Trajectories(2, offset=1, stride=4)  # worker 1 of 4
        >>> trajectories.start_all()
        >>> trajectories.ids.tolist(), trajectories.new_id(), trajectories.counter
        ([1, 5], 9, 3)

        At most 2 steps, the episode of env 1 ending after its first:

        >>> capped = Trajectories(2, offset=0, stride=1, max_length=2)
        >>> capped.count_step().tolist()
        [False, False]
        >>> capped.start(1)  # env 1 begins a new trajectory
        >>> capped.count_step().tolist(), bool(capped.count_step(1))
        ([True, False], True)
    """

    def __init__(self, n_envs: int, offset: int, stride: int, max_length: int | None = None) -> None:
        self.offset, self.stride = offset, stride
        self.max_length = max_length
        # A limit no length reaches stands for none: the comparison costs less than a branch on None per step.
        self._limit = max_length if max_length is not None else np.iinfo(np.int64).max
        #: how many ids were handed out
        self.counter = 0
        #: each env's trajectory id
        self.ids = np.zeros(n_envs, dtype=np.int64)
        #: each env's steps in its trajectory so far (:meth:`count_step`; 0 where it just began)
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
        self.start(np.arange(len(self.ids)))

    def start(self, envs: int | Sequence[int] | np.ndarray) -> None:
        """Each env of ``envs`` (one env, or an array of them) begins a new trajectory: a new id, no step yet."""
        self.ids[envs] = self.new_id() if isinstance(envs, int) else self.new_ids(len(envs))
        self.lengths[envs] = 0

    @overload
    def count_step(self, envs: int) -> np.bool_: ...

    @overload
    def count_step(self, envs: slice = ...) -> np.ndarray: ...

    def count_step(self, envs: int | slice = _EVERY_ENV) -> np.bool_ | np.ndarray:
        """Counts one step of each env of ``envs`` (one env, or a slice of them: every env by default) in its
        trajectory.

        Returns:
            Which of them reached :attr:`max_length` steps with it (bool, one per env of a slice): their trajectory
            ends with this step, truncated unless its episode ended anyway, and the caller resets those envs.
            Never true without a limit.
        """
        lengths = self.lengths
        lengths[envs] += 1
        return lengths[envs] >= self._limit
