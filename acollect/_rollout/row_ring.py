"""Rows of two batches in one ring, for the coroutine-env engine (:mod:`acollect._rollout.coroutines`).

Row ``i`` of a batch is env ``i``'s ``T`` consecutive steps. Envs step at their
own pace, so at any moment some rows of the current batch are full and others
are not. :class:`RowRing` holds the current batch and the next one in one
``[n_envs, 2T]`` buffer: an env whose row of the current batch is full goes on
in its row of the next one, an env whose next row is full too is *parked*
until the current batch is handed out, and memory stays at two batches.

Examples:
    >>> import torch
    >>> ring = RowRing(n_envs=2, time_steps=2)
    >>> ring.allocate({"observation": ((1,), torch.float32)}, ((1,), torch.float32), {})
    >>> ring.place([0, 1]).tolist()
    [0, 0]
    >>> [ring.advance(0) for _ in range(4)]  # env 0 fills both its rows, then is parked
    [True, True, True, False]
    >>> ring.ready.is_set(), ring.advance(1), ring.advance(1), ring.ready.is_set()
    (False, True, True, True)
    >>> batch, released = ring.hand_out()
    >>> batch.batch_size, released
    (torch.Size([2, 2]), [0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["RowRing"]

_COLLECTOR = "collector"
Layout = Mapping[Any, tuple[Sequence[int], torch.dtype]]


class RowRing:
    """Where each env's next step goes, in a ``[n_envs, 2T]`` buffer holding this batch and the next.

    Args:
        n_envs: rows.
        time_steps: ``T``, steps per row of a batch.

    Attributes:
        ready: set once every row of the current batch is full.
        views: numpy views of the buffer's leaves (``"obs"``, ``"next_obs"``, ``"reward"``, the flags,
            ``"traj"``, ``"version"``, ``"outputs"``), for writes without TensorDict.
    """

    def __init__(self, n_envs: int, time_steps: int) -> None:
        self.n, self.T = n_envs, time_steps
        # env i's next step goes to [0, T): this batch, [T, 2T): the next one; 2T: parked
        self.ahead = np.zeros(n_envs, dtype=np.int64)
        self.cols = np.zeros(n_envs, dtype=np.int64)  # the ring column of the step env i is taking
        self.ready = anyio.Event()
        self.views: dict[str, Any] = {}
        self.buffer: TensorDict | None = None
        self._base = 0  # the ring column where the current batch starts
        self._unfinished = n_envs
        self._parked: list[int] = []

    def allocate(self, observations: Layout, reward: tuple[Sequence[int], torch.dtype], outputs: Layout) -> None:
        """Allocates the buffer (observation keys, policy outputs, TorchRL's layout) and starts afresh."""
        E, W = self.n, 2 * self.T

        def zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros((E, W, *shape), dtype=dtype)

        buf, nxt = TensorDict({}, batch_size=(E, W)), TensorDict({}, batch_size=(E, W))
        for key, (shape, dtype) in observations.items():
            buf.set(key, zeros(shape, dtype))
            nxt.set(key, zeros(shape, dtype))
        for key in ("done", "terminated", "truncated"):  # as they stood before each step: a reset env's are False
            buf.set(key, zeros((1,), torch.bool))
            nxt.set(key, zeros((1,), torch.bool))
        nxt.set("reward", zeros(*reward))
        for key, (shape, dtype) in outputs.items():
            buf.set(key, zeros(shape, dtype))
        buf.set("next", nxt)
        buf.set((_COLLECTOR, "traj_ids"), zeros((), torch.int64))
        buf.set((_COLLECTOR, "policy_version"), zeros((), torch.int64))
        self.buffer = buf
        self.views = {
            "obs": [buf.get(k).numpy() for k in observations],
            "next_obs": [nxt.get(k).numpy() for k in observations],
            **{k: nxt.get(k).numpy().reshape(E, W) for k in ("reward", "terminated", "truncated", "done")},
            "traj": buf.get((_COLLECTOR, "traj_ids")).numpy(),
            "version": buf.get((_COLLECTOR, "policy_version")).numpy(),
            "outputs": [(k, buf.get(k).numpy()) for k in outputs],
        }
        self.ahead[:] = 0
        self._base, self._unfinished, self._parked = 0, self.n, []
        self.ready = anyio.Event()

    @property
    def stepped(self) -> int:
        """Frames stepped into the two batches held (given up when the ring is allocated afresh)."""
        return int(np.minimum(self.ahead, 2 * self.T).sum())

    def place(self, rows: Any) -> np.ndarray:
        """The ring columns of the steps ``rows`` take now (remembered in :attr:`cols`)."""
        cols = (self._base + self.ahead[rows]) % (2 * self.T)
        self.cols[rows] = cols
        return cols

    def last_col(self, i: int) -> int | None:
        """The ring column of env ``i``'s last step while it is in a batch not handed out yet (``None``: it went out
        with the last batch, or env ``i`` took no step since the ring was allocated)."""
        ahead = int(self.ahead[i])
        return None if ahead == 0 else (self._base + ahead - 1) % (2 * self.T)

    def advance(self, i: int) -> bool:
        """Env ``i`` finished its step; returns whether it may take another (False: parked)."""
        ahead = int(self.ahead[i]) + 1
        self.ahead[i] = ahead
        if ahead == self.T:
            self._unfinished -= 1
            if self._unfinished == 0:
                self.ready.set()
        if ahead >= 2 * self.T:
            self._parked.append(i)  # both its rows are full: it waits for the batch to be handed out
            return False
        return True

    def hand_out(self) -> tuple[TensorDict, list[int]]:
        """The current batch (a copy the caller owns), and the parked envs, free to go on now.

        Call it once :attr:`ready` is set.
        """
        assert self.buffer is not None
        assert self.ready.is_set()
        T, base = self.T, self._base
        batch = self.buffer[:, base : base + T].clone()
        self._base = (base + T) % (2 * T)
        self.ahead -= T
        self._unfinished = int((self.ahead < T).sum())
        self.ready = anyio.Event()
        if self._unfinished == 0:
            self.ready.set()
        released, self._parked = self._parked, []
        return batch, released
