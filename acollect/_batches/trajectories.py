"""Splitting ``[n_envs, T]`` batches into padded trajectories.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> ids = torch.tensor([[0, 0, 2], [1, 1, 1]])
    >>> batch = TensorDict({"obs": torch.arange(6).reshape(2, 3), ("collector", "traj_ids"): ids}, [2, 3])
    >>> out = split_trajectories(batch)
    >>> out["obs"].tolist(), out["collector", "mask"].tolist()
    ([[0, 1, 0], [2, 0, 0], [3, 4, 5]], [[True, True, False], [True, False, False], [True, True, True]])
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

__all__ = ["split_trajectories"]


def split_trajectories(batch: TensorDictBase) -> TensorDictBase:
    """Rearranges ``[n_envs, T]`` into ``[n_traj, T_max]``, zero-padded, with ``("collector", "mask")``.

    Trajectories are ordered by env, then time. ``mask`` is True on real frames.

    Args:
        batch: a batch with a ``("collector", "traj_ids")`` entry.

    Returns:
        The padded batch, dims named ``[None, "time"]``.
    """
    ids = batch.get(("collector", "traj_ids"))
    n_envs, steps = ids.shape
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    flat_starts = starts.reshape(-1)
    segment = torch.cumsum(flat_starts.to(torch.int64), 0) - 1
    n_traj = int(segment[-1]) + 1
    start_index = torch.nonzero(flat_starts).squeeze(-1)
    position = torch.arange(n_envs * steps) - start_index[segment]
    t_max = int(torch.bincount(segment).max())

    flat = batch.copy()
    flat.names = None
    flat = flat.reshape(-1)

    def scatter(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros((n_traj, t_max, *x.shape[1:]))
        out[segment, position] = x
        return out

    result = flat.apply(scatter, batch_size=[n_traj, t_max])
    assert result is not None  # apply returns None only with inplace=True
    mask = torch.zeros((n_traj, t_max), dtype=torch.bool, device=ids.device)
    mask[segment, position] = True
    result.set(("collector", "mask"), mask)
    result.names = [None, "time"]
    return result
