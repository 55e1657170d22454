"""Trajectories (:mod:`acollect._batches.trajectories`, :mod:`acollect._batches.trajectory_batches`): which frames go
where, frame by frame, and which trajectories end how.

Each test kills mutants that ``tools/mutation.py trajectories`` found alive: a piece joined to the wrong
trajectory, a trajectory given up that was not (or the other way round), a flag set on the wrong frame, padding
that is not zeros, a worker's trajectories mistaken for another's.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from acollect._batches.trajectories import split_trajectories
from acollect._batches.trajectory_batches import TrajectoryAssembler


def batch(ids: list[list[int]], done: list[list[bool]], *, first_obs: int = 0) -> TensorDict:
    """A ``[rows, T]`` batch whose observation counts up from ``first_obs`` (so every frame is told apart), with a
    nested leaf of two values per frame."""
    rows, steps = len(ids), len(ids[0])
    obs = torch.arange(first_obs, first_obs + rows * steps).reshape(rows, steps)
    td = TensorDict(
        {
            "observation": obs,
            "pair": torch.stack([obs, -obs], dim=-1),
            ("collector", "traj_ids"): torch.tensor(ids),
            ("next", "done"): torch.tensor(done).unsqueeze(-1),
            ("next", "terminated"): torch.tensor(done).unsqueeze(-1),
            ("next", "truncated"): torch.zeros(rows, steps, 1, dtype=torch.bool),
        },
        batch_size=[rows, steps],
    )
    td.names = [None, "time"]
    return td


def frames(out: TensorDict) -> list[list[int]]:
    """Each row's real observations (the mask's frames)."""
    mask = out["collector", "mask"]
    return [out["observation"][row][mask[row]].tolist() for row in range(out.shape[0])]


def test_split_trajectories_puts_every_frame_in_its_trajectory_padded_with_zeros() -> None:
    td = batch([[4, 4, 6, 6, 6], [5, 7, 7, 9, 9]], [[False, True, False, False, True], [True] + [False] * 4])
    out = split_trajectories(td)
    assert out.batch_size == torch.Size([5, 3])
    assert out.names == [None, "time"]
    assert out["observation"].tolist() == [[0, 1, 0], [2, 3, 4], [5, 0, 0], [6, 7, 0], [8, 9, 0]]
    assert out["pair"][:, :, 1].tolist() == [[0, -1, 0], [-2, -3, -4], [-5, 0, 0], [-6, -7, 0], [-8, -9, 0]]
    assert out["collector", "traj_ids"].tolist() == [[4, 4, 0], [6, 6, 6], [5, 0, 0], [7, 7, 0], [9, 9, 0]]
    assert out["collector", "mask"].tolist() == [
        [True, True, False], [True, True, True], [True, False, False], [True, True, False], [True, True, False],
    ]  # fmt: skip
    assert out["collector", "mask"].dtype == torch.bool
    assert out["next", "done"].squeeze(-1).tolist() == [
        [False, True, False], [False, False, True], [True, False, False], [False, False, False], [False, False, False],
    ]  # fmt: skip


def test_split_trajectories_of_one_trajectory_per_row() -> None:
    out = split_trajectories(batch([[1, 1], [2, 2]], [[False, False], [False, True]]))
    assert out["observation"].tolist() == [[0, 1], [2, 3]]
    assert out["collector", "mask"].all()


def test_pieces_of_one_trajectory_across_batches_are_joined_in_order() -> None:
    assembler = TrajectoryAssembler()
    assembler.add(batch([[3, 3, 3], [4, 4, 4]], [[False] * 3, [False, False, True]]))
    assert (assembler.complete, assembler.in_progress, assembler.empty) == (1, 1, False)
    assembler.add(batch([[3, 3, 5], [6, 6, 6]], [[False, True, False], [False] * 3], first_obs=10))
    assert (assembler.complete, assembler.in_progress) == (2, 2)
    out = assembler.take(2)
    assert frames(out) == [[3, 4, 5], [0, 1, 2, 10, 11]]  # in the order they ended
    assert out["pair"][1, :, 1].tolist() == [0, -1, -2, -10, -11]
    assert out["collector", "traj_ids"].tolist() == [[4, 4, 4, 0, 0], [3, 3, 3, 3, 3]]
    assert out.batch_size == torch.Size([2, 5])
    assert out.names == [None, "time"]
    assert out["observation"][0, 3:].tolist() == [0, 0]  # padding
    assert (assembler.complete, assembler.in_progress) == (0, 2)


def test_a_held_piece_is_a_copy_of_the_batch() -> None:
    assembler = TrajectoryAssembler()
    td = batch([[1, 1]], [[False, False]])
    assembler.add(td)
    td["observation"].fill_(-1)
    assembler.add(batch([[1]], [[True]], first_obs=2))
    assert frames(assembler.take(1)) == [[0, 1, 2]]


def test_a_trajectory_its_worker_dropped_is_cut_and_others_workers_wait() -> None:
    assembler = TrajectoryAssembler(workers=2)  # worker 0: even ids, worker 1: odd ids
    assembler.add(batch([[0, 0], [1, 1], [3, 3]], [[False, False]] * 3))
    assert (assembler.complete, assembler.in_progress) == (0, 3)
    # worker 0 goes on with a new trajectory (id 0 was given up: a reset that was no episode's end)
    assembler.add(batch([[2, 2]], [[False, False]], first_obs=10))
    assert (assembler.complete, assembler.in_progress) == (1, 3)  # worker 1's trajectories wait for its batches
    cut = assembler.take(1)
    assert frames(cut) == [[0, 1]]
    assert cut["next", "truncated"].squeeze(-1).tolist() == [[False, True]]
    assert cut["next", "done"].squeeze(-1).tolist() == [[False, True]]
    assert cut["next", "terminated"].squeeze(-1).tolist() == [[False, False]]
    # worker 1 goes on with trajectory 3 only: 1 was given up
    assembler.add(batch([[3, 3]], [[False, True]], first_obs=20))
    assert (assembler.complete, assembler.in_progress) == (2, 1)
    out = assembler.take(2)
    assert frames(out) == [[2, 3], [4, 5, 20, 21]]
    assert out["next", "truncated"].squeeze(-1).tolist() == [[False, True, False, False], [False] * 4]


def test_a_lost_workers_trajectories_end_cut_and_the_others_stay_open() -> None:
    assembler = TrajectoryAssembler(workers=3)
    assembler.add(batch([[0, 0], [3, 3], [1, 1], [2, 2]], [[False, False]] * 4))
    assert assembler.end_worker(0) == 2
    assert assembler.end_worker(0) == 0
    assert (assembler.complete, assembler.in_progress) == (2, 2)
    out = assembler.take(2)
    assert frames(out) == [[0, 1], [2, 3]]
    assert out["next", "truncated"].squeeze(-1).tolist() == [[False, True], [False, True]]


def test_flush_ends_every_open_trajectory_cut_and_clear_forgets_all() -> None:
    assembler = TrajectoryAssembler()
    assembler.add(batch([[1, 2], [3, 3]], [[True, False], [False, False]]))
    assert assembler.flush() == 2
    assert (assembler.complete, assembler.in_progress) == (3, 0)
    out = assembler.take(3)
    assert frames(out) == [[0], [1], [2, 3]]
    assert out["next", "truncated"].squeeze(-1).tolist() == [[False, False], [True, False], [False, True]]
    assert assembler.empty
    assert assembler.flush() == 0
    assembler.add(batch([[1, 2]], [[True, False]]))
    assembler.clear()
    assert (assembler.complete, assembler.in_progress, assembler.empty) == (0, 0, True)


def test_stacked_batches_of_workers_are_rows_too() -> None:
    assembler = TrajectoryAssembler(workers=2)
    td = batch([[0, 0], [2, 4], [1, 1], [3, 3]], [[False, True], [True, False], [False, False], [False, True]])
    stacked = td.reshape(2, 2, 2)
    assembler.add(stacked)
    assert (assembler.complete, assembler.in_progress) == (3, 2)
    assert frames(assembler.take(3)) == [[0, 1], [2], [6, 7]]


def test_take_takes_the_oldest_and_refuses_more_than_there_are() -> None:
    assembler = TrajectoryAssembler()
    assembler.add(batch([[1, 2, 3]], [[True, True, True]]))
    assert frames(assembler.take(1)) == [[0]]
    assert frames(assembler.take(2)) == [[1], [2]]
    with pytest.raises(AssertionError, match=r"^0 complete trajectories, 1 asked for"):
        assembler.take(1)
    with pytest.raises(AssertionError):
        assembler.take(0)


def test_stacked_batches_of_unequal_dimensions() -> None:
    ids = [[0, 0, 2, 2], [4, 4, 4, 4], [6, 8, 8, 8], [1, 1, 1, 3], [5, 5, 5, 5], [7, 7, 7, 7]]
    done = [[False, True, False, False]] + [[False] * 4] * 2 + [[False, False, True, False]] + [[False] * 4] * 2
    assembler = TrajectoryAssembler(workers=2)
    assembler.add(batch(ids, done).reshape(2, 3, 4))  # 2 workers, 3 envs each, 4 steps
    assert (assembler.complete, assembler.in_progress) == (2, 7)
    assert frames(assembler.take(2)) == [[0, 1], [12, 13, 14]]


def test_a_trajectory_that_begins_at_the_last_step_is_split_off() -> None:
    out = split_trajectories(batch([[1, 1, 1], [3, 3, 4]], [[False] * 3] * 2))
    assert out["observation"].tolist() == [[0, 1, 2], [3, 4, 0], [5, 0, 0]]


def test_the_batches_device_is_the_one_handed_out() -> None:
    assembler = TrajectoryAssembler()
    assert assembler.workers == 1
    td = batch([[1, 1]], [[False, True]])
    assembler.add(TensorDict(td.to_dict(), batch_size=td.batch_size, device="cpu"))
    out = assembler.take(1)
    assert out.device == torch.device("cpu")
    assert frames(out) == [[0, 1]]
    assembler.add(batch([[2]], [[True]]))  # no device: none handed out either
    assert assembler.take(1).device is None
