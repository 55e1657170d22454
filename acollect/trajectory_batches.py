"""Batches of whole episodes: frames gathered into complete trajectories, handed out N at a time.

``trajs_per_batch=N`` (every collector kind) hands out batches of N complete episodes, ``[N, L]`` padded to the
longest with a boolean ``("collector", "mask")``, in the order they ended. :class:`TrajectoryAssembler` takes the
collector's ordinary batches (``[n_envs, T]``, or stacked ``[n_workers, n_envs, T]``) as they come: each env's row
is cut where its trajectory id changes, a trajectory that goes on past a batch is kept and continued from the next
one (trajectory ids are unique per collector, so pieces of one find each other whatever worker or batch they come
from), and a trajectory is complete when its last frame is done (terminated or truncated). What was collected is
handed out once and only once: when the collector has its ``total_frames``, :meth:`flush` hands out the
trajectories still in progress, each truncated at its last frame (``("next", "truncated")`` and ``done`` set there),
so a trajectory longer than ``total_frames`` still reaches the caller, cut.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> def batch(obs, ids, done):
    ...     td = TensorDict({"obs": torch.tensor(obs), ("collector", "traj_ids"): torch.tensor(ids)}, [1, 3])
    ...     td.set(("next", "done"), torch.tensor(done).unsqueeze(-1))
    ...     td.set(("next", "truncated"), torch.zeros(1, 3, 1, dtype=torch.bool))
    ...     return td
    >>> assembler = TrajectoryAssembler()
    >>> assembler.add(batch([[0, 1, 2]], [[7, 7, 8]], [[False, True, False]]))
    >>> assembler.complete
    1
    >>> assembler.add(batch([[3, 4, 5]], [[8, 8, 9]], [[False, True, False]]))
    >>> out = assembler.take(2)
    >>> out["obs"].tolist(), out["collector", "mask"].tolist()
    ([[0, 1, 0], [2, 3, 4]], [[True, True, False], [True, True, True]])
    >>> assembler.flush()["obs"].tolist()  # the one in progress, cut
    [[5]]
"""

from __future__ import annotations

from collections import OrderedDict
from typing import cast

import torch
from tensordict import TensorDictBase

__all__ = ["TrajectoryAssembler"]

_IDS = ("collector", "traj_ids")
_MASK = ("collector", "mask")


class TrajectoryAssembler:
    """Gathers frames into complete trajectories and hands them out ``n`` at a time (see the module's notes)."""

    def __init__(self) -> None:
        self._open: OrderedDict[int, list[TensorDictBase]] = OrderedDict()  # traj id -> its pieces, in order
        self._done: list[TensorDictBase] = []  # complete trajectories, each [L], in the order they ended

    @property
    def complete(self) -> int:
        """Complete trajectories waiting to be handed out."""
        return len(self._done)

    @property
    def in_progress(self) -> int:
        """Trajectories begun and not ended yet."""
        return len(self._open)

    def add(self, batch: TensorDictBase) -> None:
        """Takes a collector batch (time last; envs, and workers, before it)."""
        rows = batch.reshape(-1, batch.shape[-1]) if batch.batch_dims != 2 else batch
        rows = rows.copy()
        rows.names = None
        ids = rows.get(_IDS)
        done = rows.get(("next", "done")).reshape(ids.shape)
        for env in range(ids.shape[0]):
            row_ids, row_done = ids[env], done[env]
            cuts = (torch.nonzero(row_ids[1:] != row_ids[:-1]).squeeze(-1) + 1).tolist()
            for start, stop in zip([0, *cuts], [*cuts, ids.shape[1]], strict=True):
                traj = int(row_ids[start])
                # A copy: the batch may be lent shared memory, given back only once nothing holds a view of it.
                piece = rows[env, start:stop].clone()
                self._open.setdefault(traj, []).append(piece)
                if bool(row_done[stop - 1]):
                    self._done.append(_join(self._open.pop(traj)))

    def take(self, n: int) -> TensorDictBase:
        """The oldest ``n`` complete trajectories as one ``[n, L]`` batch (``n`` must be at most :attr:`complete`)."""
        assert n <= len(self._done), f"{len(self._done)} complete trajectories, {n} asked for"
        trajs, self._done = self._done[:n], self._done[n:]
        return _pad(trajs)

    def flush(self) -> TensorDictBase | None:
        """Every trajectory left (complete, then in progress, truncated at its last frame) as one batch; ``None`` if
        none is left."""
        trajs, self._done = self._done, []
        for pieces in self._open.values():
            traj = _join(pieces)
            last = traj.shape[0] - 1
            for key in (("next", "truncated"), ("next", "done")):
                if key in traj.keys(include_nested=True):
                    traj.get(key)[last] = True
            trajs.append(traj)
        self._open.clear()
        return _pad(trajs) if trajs else None


def _join(pieces: list[TensorDictBase]) -> TensorDictBase:
    return pieces[0] if len(pieces) == 1 else cast(TensorDictBase, torch.cat(pieces, 0))  # type: ignore[arg-type]


def _pad(trajs: list[TensorDictBase]) -> TensorDictBase:
    longest = max(t.shape[0] for t in trajs)
    padded = []
    for traj in trajs:
        length = traj.shape[0]
        if length < longest:
            filler = traj[:1].expand(longest - length).clone().zero_()
            traj = _join([traj, filler])
        padded.append(traj)
    out = cast(TensorDictBase, torch.stack(padded, 0))  # type: ignore[arg-type]
    mask = torch.zeros(out.shape[:2], dtype=torch.bool)
    for i, traj in enumerate(trajs):
        mask[i, : traj.shape[0]] = True
    out.set(_MASK, mask)
    out.names = [None, "time"]
    return out
