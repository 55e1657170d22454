"""Batches of whole episodes: frames gathered into complete trajectories, handed out N at a time.

``trajs_per_batch=N`` (every collector kind) hands out batches of N complete episodes, ``[N, L]`` padded to the
longest with zeros and a boolean ``("collector", "mask")`` (True on real frames), in the order they ended.
:class:`TrajectoryAssembler` takes the collector's ordinary batches (``[n_envs, T]``, or stacked ``[n_workers,
n_envs, T]``) as they come: each env's row is cut where its trajectory id changes, a trajectory that goes on past a
batch is kept and continued from the next one (trajectory ids are unique per collector: worker ``k`` of ``n`` takes
``k, k + n, k + 2n...``, so pieces of one find each other whatever worker or batch they come from), and a trajectory
is complete when its last frame is done (terminated or truncated).

A trajectory can also be given up by its env: a reset that was not an episode's end (``reset_at_each_iter``, a
reseed, a restored state, a restarted worker) starts a new id in the same row. Every env of a worker steps through
every batch that worker sends, so a trajectory of a worker present in a batch that gets no frame of it was given up:
it is complete as it stands, truncated at its last frame (``("next", "truncated")`` and ``done`` set there).

What was collected is handed out once and only once: when the collector has its ``total_frames``, :meth:`flush`
ends the trajectories still in progress the same way, truncated at their last frame, so a trajectory longer than
``total_frames`` still reaches the caller, cut.

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
    >>> assembler.complete, assembler.in_progress
    (1, 1)
    >>> assembler.add(batch([[3, 4, 5]], [[8, 8, 9]], [[False, True, False]]))
    >>> out = assembler.take(2)
    >>> out["obs"].tolist(), out["collector", "mask"].tolist()
    ([[0, 1, 0], [2, 3, 4]], [[True, True, False], [True, True, True]])
    >>> assembler.flush()  # the one in progress, cut: complete now
    1
    >>> last = assembler.take(1)
    >>> last["obs"].tolist(), last["next", "truncated"].squeeze(-1).tolist()
    ([[5]], [[True]])
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["TrajectoryAssembler"]

_IDS = ("collector", "traj_ids")
_MASK = ("collector", "mask")
_FLAGS = ("truncated", "done")  # under "next": the root ones and a group's (("next", "agents", "done"), ...)

Key = str | tuple[str, ...]
#: One trajectory's frames (or a piece of them): each leaf of the batch by its key, time first.
Frames = dict[Key, torch.Tensor]


class TrajectoryAssembler:
    """Gathers frames into complete trajectories and hands them out ``n`` at a time (see the module's notes).

    Not thread-safe: one caller at a time (a collector adds and takes under its consumer lock).

    Args:
        workers: the workers whose batches come in (the step between one worker's trajectory ids): worker
            ``k`` of them takes the ids ``k, k + workers, ...``.
    """

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self._open: OrderedDict[int, list[Frames]] = OrderedDict()  # traj id -> its pieces, in order
        self._done: list[Frames] = []  # complete trajectories, in the order they ended
        self._device: torch.device | None = None  # the batches' (a TensorDict's device)

    @property
    def complete(self) -> int:
        """Complete trajectories waiting to be handed out."""
        return len(self._done)

    @property
    def in_progress(self) -> int:
        """Trajectories begun and not ended yet."""
        return len(self._open)

    @property
    def empty(self) -> bool:
        """Whether no frame is held: every frame added was handed out."""
        return not self._open and not self._done

    def add(self, batch: TensorDictBase) -> None:
        """Takes a collector batch (time last; envs, and workers, before it); its frames are copied, so a batch
        lent from shared memory can be given back as soon as the caller drops it."""
        rows = batch.copy()
        rows.names = None
        if rows.batch_dims != 2:
            rows = rows.reshape(-1, rows.shape[-1])
        self._device = rows.device
        ids = rows.get(_IDS)
        n_rows, steps = ids.shape
        self._cut_given_up(ids)
        # Every piece (a run of one id in one row) at once: where each starts in the flattened rows, how long.
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        first = torch.nonzero(starts.reshape(-1)).squeeze(-1)
        lengths = torch.diff(first, append=first.new_tensor([n_rows * steps]))
        trajs = ids.reshape(-1)[first].tolist()
        ended = rows.get(("next", "done")).reshape(-1)[first + lengths - 1].tolist()
        # One copy per leaf (the batch may be lent shared memory, given back once nothing holds a view of it);
        # each piece is a view of that copy, and one still open at the end is copied on its own below, so a long
        # episode never keeps whole batches alive.
        lengths_list = lengths.tolist()
        split: dict[Key, tuple[torch.Tensor, ...]] = {}
        for key, leaf in rows.items(include_nested=True, leaves_only=True):
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(f"{key!r} holds no tensor ({type(leaf).__name__}): episodes are gathered from tensors")
            split[key] = leaf.reshape(n_rows * steps, *leaf.shape[2:]).clone().split(lengths_list)
        open_here = []
        for i, traj in enumerate(trajs):
            piece = {key: parts[i] for key, parts in split.items()}
            self._open.setdefault(traj, []).append(piece)
            if ended[i]:
                self._done.append(_join(self._open.pop(traj)))
            else:
                open_here.append(traj)
        for traj in open_here:
            pieces = self._open[traj]
            pieces[-1] = {key: leaf.clone() for key, leaf in pieces[-1].items()}

    def _cut_given_up(self, ids: torch.Tensor) -> None:
        """Ends, truncated, the open trajectories of the workers in ``ids`` that get no frame from it."""
        if not self._open:
            return
        seen = set(ids.unique().tolist())
        present = {traj % self.workers for traj in seen}
        for traj in [t for t in self._open if t not in seen and t % self.workers in present]:
            self._done.append(_truncate(_join(self._open.pop(traj))))

    def end_worker(self, worker: int) -> int:
        """Ends, truncated, the open trajectories of ``worker`` (one lost for good: no batch of it will come to
        end them); returns how many."""
        ended = [traj for traj in self._open if traj % self.workers == worker]
        for traj in ended:
            self._done.append(_truncate(_join(self._open.pop(traj))))
        return len(ended)

    def take(self, n: int) -> TensorDictBase:
        """The oldest ``n`` complete trajectories as one ``[n, L]`` batch (``1 <= n <=`` :attr:`complete`)."""
        assert 0 < n <= len(self._done), f"{len(self._done)} complete trajectories, {n} asked for"
        trajs, self._done = self._done[:n], self._done[n:]
        return _pad(trajs, self._device)

    def flush(self) -> int:
        """Ends every trajectory in progress, truncated at its last frame; returns how many (complete now)."""
        cut = len(self._open)
        self._done.extend(_truncate(_join(pieces)) for pieces in self._open.values())
        self._open.clear()
        return cut

    def clear(self) -> None:
        """Forgets every frame held."""
        self._open.clear()
        self._done.clear()


def _join(pieces: list[Frames]) -> Frames:
    if len(pieces) == 1:
        return pieces[0]
    return {key: torch.cat([piece[key] for piece in pieces]) for key in pieces[0]}


def _truncate(traj: Frames) -> Frames:
    """``traj`` ended at its last frame: truncated there (not terminated: the episode did not end by itself)."""
    for key, leaf in traj.items():
        if isinstance(key, tuple) and key[0] == "next" and key[-1] in _FLAGS:
            leaf[-1] = True
    return traj


def _length(traj: Frames) -> int:
    return next(iter(traj.values())).shape[0]


def _pad(trajs: list[Frames], device: torch.device | None) -> TensorDictBase:
    """``trajs`` as one ``[n, L]`` batch, zero-padded to the longest, with the mask of the real frames."""
    lengths = [_length(traj) for traj in trajs]
    longest = max(lengths)
    # Where each frame goes, computed once: row i holds trajectory i from time 0 on.
    rows = torch.tensor([i for i, length in enumerate(lengths) for _ in range(length)])
    times = torch.tensor([t for length in lengths for t in range(length)])
    out = TensorDict({}, batch_size=[len(trajs), longest], device=device)
    for key, leaf in trajs[0].items():
        frames = torch.cat([traj[key] for traj in trajs])
        padded = leaf.new_zeros((len(trajs), longest, *leaf.shape[1:]))
        padded[rows.to(leaf.device), times.to(leaf.device)] = frames
        out.set(key, padded)
    mask = torch.arange(longest).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    out.set(_MASK, mask.to(device) if device is not None else mask)
    out.names = [None, "time"]
    return out
