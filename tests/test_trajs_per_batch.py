"""``trajs_per_batch=N``: batches of N whole episodes, ``[N, L]`` with a mask, from every kind of collector.

Counting envs make every frame checkable: each trajectory handed out is a run of real, consecutive steps that
ends with done (terminated after exactly its env's ``episode_length`` steps, so it began at a reset), every frame
collected is handed out once, and the episodes of one env follow each other with nothing lost between them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDictBase

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    CollectorState,
    ConfigurationError,
    DistributedCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from acollect._batches.trajectory_batches import TrajectoryAssembler
from acollect.envs import AsyncEnvPool
from acollect.testing import ENV_STRIDE, RESET_JUMP, AsyncCountingEnv, CountingEnv, no_leaks, wait_until

LENGTHS = [3, 5]  # per sub-env: batches of whole episodes of two lengths, padded to the longest
START_METHOD = "forkserver"


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    with no_leaks():
        yield


def _env(start: int = 0, lengths: list[int] = LENGTHS) -> CountingEnv:
    return CountingEnv(num_envs=len(lengths), episode_length=lengths, start=start)


def _trajectories(batch: TensorDictBase) -> list[TensorDictBase]:
    """The real frames of each row, checked to be a prefix of the row, the padding zeros."""
    mask = batch["collector", "mask"]
    assert mask.dtype == torch.bool
    assert mask.shape == batch.shape
    out = []
    for row in range(batch.shape[0]):
        length = int(mask[row].sum())
        assert length >= 1
        assert mask[row, :length].all(), f"row {row}: the mask is not a prefix: {mask[row]}"
        assert (batch["observation"][row, length:] == 0).all(), "padding is not zeros"
        out.append(batch[row, :length])
    return out


def _check_run(traj: TensorDictBase) -> None:
    """Real consecutive steps of one episode, done at the last frame only."""
    obs = traj["observation"].squeeze(-1).double()
    nxt = traj["next", "observation"].squeeze(-1).double()
    done = traj["next", "done"].squeeze(-1)
    assert (nxt - obs == 1).all(), f"not real transitions: {obs.tolist()} -> {nxt.tolist()}"
    assert (obs[1:] == nxt[:-1]).all(), f"frames missing or repeated inside: {obs.tolist()}"
    assert done[-1], f"done flags {done.tolist()}"
    assert not done[:-1].any(), f"done flags {done.tolist()}"
    assert traj["collector", "traj_ids"].unique().numel() == 1


async def _collect(collector: Any) -> list[TensorDictBase]:
    async with collector:
        with anyio.fail_after(120):
            return [batch async for batch in collector]


def _check_whole_episodes(batches: list[TensorDictBase], n: int, total_frames: int, envs: dict[int, int]) -> None:
    """``envs``: the first observation of each sub-env's counter -> its episode length."""
    trajs = [traj for batch in batches for traj in _trajectories(batch)]
    for batch in batches[:-1]:
        assert batch.shape[0] == n
    assert 1 <= batches[-1].shape[0] <= n
    for batch in batches:
        assert batch.shape[1] == int(batch["collector", "mask"].sum(-1).max())  # padded to the longest
    frames = [f for traj in trajs for f in traj["observation"].squeeze(-1).tolist()]
    assert len(frames) == len(set(frames)), "a frame was handed out twice"
    assert len(frames) == total_frames  # every frame collected, handed out
    by_env: dict[int, list[TensorDictBase]] = {}
    for traj in trajs:
        _check_run(traj)
        first = int(traj["observation"][0])
        by_env.setdefault(first // ENV_STRIDE * ENV_STRIDE, []).append(traj)
    assert set(by_env) == set(envs)
    for env, episodes in by_env.items():
        episodes.sort(key=lambda traj: float(traj["observation"][0]))
        for before, after in itertools.pairwise(episodes):
            # The next episode starts at the reset after the one before: nothing lost between them.
            assert float(after["observation"][0]) == float(before["next", "observation"][-1]) + RESET_JUMP
        for traj in episodes[:-1]:  # whole episodes: terminated after exactly the env's episode length
            assert traj.shape[0] == envs[env]
            assert traj["next", "terminated"][-1].all()
        last = episodes[-1]  # ended by total_frames, perhaps: then cut, truncated
        if last.shape[0] < envs[env]:
            assert last["next", "truncated"][-1].all()
            assert not last["next", "terminated"][-1].any()
        else:
            assert last["next", "terminated"][-1].all()


async def test_in_process_collector_hands_out_whole_episodes() -> None:
    collector = Collector(_env, frames_per_batch=8, total_frames=64, trajs_per_batch=3)
    batches = await _collect(collector)
    _check_whole_episodes(batches, 3, 64, {0: 3, ENV_STRIDE: 5})
    assert collector.frames == 64
    assert collector.stats().batches == len(batches)


async def test_coroutine_envs_on_the_event_loop_hand_out_whole_episodes() -> None:
    pool = functools.partial(AsyncEnvPool, functools.partial(AsyncCountingEnv, episode_length=5), 4)
    collector = Collector(pool, frames_per_batch=32, total_frames=96, trajs_per_batch=3)
    batches = await _collect(collector)
    trajs = [traj for batch in batches for traj in _trajectories(batch)]
    assert sum(traj.shape[0] for traj in trajs) == 96
    cut = 0
    for traj in trajs:
        _check_run(traj)  # each step counts 1 from the reset's 0
        if traj["next", "terminated"][-1].all():
            assert traj["observation"].squeeze(-1).tolist() == [0, 1, 2, 3, 4]
        else:  # in progress at total_frames: cut
            assert traj["next", "truncated"][-1].all()
            cut += 1
    assert cut <= 4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_whole_episodes_land_on_the_storing_device(device: str) -> None:
    collector = Collector(_env, frames_per_batch=8, total_frames=64, trajs_per_batch=3, storing_device=device)
    batches = await _collect(collector)
    for batch in batches:
        # By type: a batch on "cuda" says "cuda:0", and torch.device("cuda") != torch.device("cuda:0").
        assert batch.device is not None
        assert batch.device.type == device
        assert batch["collector", "mask"].device.type == device
    _check_whole_episodes([batch.cpu() for batch in batches], 3, 64, {0: 3, ENV_STRIDE: 5})


async def test_multi_async_collector_hands_out_whole_episodes() -> None:
    envs = [functools.partial(_env, 0), functools.partial(_env, 2 * ENV_STRIDE)]
    collector = MultiAsyncCollector(envs, frames_per_batch=8, total_frames=96, trajs_per_batch=4,
                                    use_shared_memory=True, start_method=START_METHOD)  # fmt: skip
    async with collector:
        with anyio.fail_after(120):
            batches = [batch async for batch in collector]
        # The workers' shared memory was lent, copied into the episodes, and every slot given back.
        assert collector.lent["lent_so_far"] > 0
        assert collector.lent["batches"] == 0
    _check_whole_episodes(batches, 4, 96, {0: 3, ENV_STRIDE: 5, 2 * ENV_STRIDE: 3, 3 * ENV_STRIDE: 5})


@pytest.mark.parametrize("cat_results", [None, -1])
async def test_multi_sync_collector_hands_out_whole_episodes(cat_results: int | None) -> None:
    envs = [functools.partial(_env, 0), functools.partial(_env, 2 * ENV_STRIDE)]
    collector = MultiSyncCollector(envs, frames_per_batch=16, total_frames=96, trajs_per_batch=4,
                                   cat_results=cat_results, start_method=START_METHOD)  # fmt: skip
    batches = await _collect(collector)
    _check_whole_episodes(batches, 4, 96, {0: 3, ENV_STRIDE: 5, 2 * ENV_STRIDE: 3, 3 * ENV_STRIDE: 5})


def _first_action(td: TensorDictBase) -> TensorDictBase:
    return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))


async def test_central_inference_hands_out_whole_episodes() -> None:
    envs = [functools.partial(_env, 0), functools.partial(_env, 2 * ENV_STRIDE)]
    collector = AsyncBatchedCollector(envs, _first_action, frames_per_batch=8, total_frames=64, trajs_per_batch=3,
                                      server="thread", start_method=START_METHOD)  # fmt: skip
    batches = await _collect(collector)
    _check_whole_episodes(batches, 3, 64, {0: 3, ENV_STRIDE: 5, 2 * ENV_STRIDE: 3, 3 * ENV_STRIDE: 5})


async def test_torch_distributed_collector_hands_out_whole_episodes() -> None:
    envs = [functools.partial(_env, 0), functools.partial(_env, 2 * ENV_STRIDE)]
    collector = DistributedCollector(envs, sync=True, backend="gloo", frames_per_batch=16, total_frames=64,
                                     trajs_per_batch=4, start_method=START_METHOD)  # fmt: skip
    batches = await _collect(collector)
    _check_whole_episodes(batches, 4, 64, {0: 3, ENV_STRIDE: 5, 2 * ENV_STRIDE: 3, 3 * ENV_STRIDE: 5})


async def test_an_episode_longer_than_total_frames_reaches_the_caller_cut() -> None:
    collector = Collector(functools.partial(_env, 0, [1000, 1000]), frames_per_batch=8, total_frames=16,
                          trajs_per_batch=4)  # fmt: skip
    batches = await _collect(collector)
    assert len(batches) == 1
    assert batches[0].shape == (2, 8)
    for traj in _trajectories(batches[0]):
        _check_run(traj)
        assert traj["next", "truncated"][-1].all()
        assert not traj["next", "terminated"].any()
    assert collector.exhausted


async def test_a_worker_collectors_episode_longer_than_total_frames_reaches_the_caller_cut() -> None:
    collector = AsyncCollector(functools.partial(_env, 0, [1000]), frames_per_batch=4, total_frames=12,
                               trajs_per_batch=2, start_method=START_METHOD)  # fmt: skip
    batches = await _collect(collector)
    assert [tuple(batch.shape) for batch in batches] == [(1, 12)]
    (traj,) = _trajectories(batches[0])
    _check_run(traj)
    assert traj["next", "truncated"][-1].all()


async def test_postproc_applies_to_the_batches_of_whole_episodes() -> None:
    shapes = []

    def postproc(batch: TensorDictBase) -> TensorDictBase:
        shapes.append(tuple(batch.shape))
        return batch

    collector = Collector(_env, frames_per_batch=8, total_frames=32, trajs_per_batch=2, postproc=postproc)
    batches = await _collect(collector)
    assert shapes == [tuple(batch.shape) for batch in batches]
    assert all(s[0] <= 2 for s in shapes)


async def test_a_postproc_failure_is_raised_and_breaks_the_collector() -> None:
    def postproc(batch: TensorDictBase) -> TensorDictBase:
        raise ValueError("postproc broke")

    async with Collector(_env, frames_per_batch=8, trajs_per_batch=2, postproc=postproc) as collector:
        with pytest.raises(ValueError, match="postproc broke"):
            await anext(collector)
        assert collector.state is CollectorState.BROKEN
        with pytest.raises(ValueError, match="postproc broke"):
            await anext(collector)


async def test_background_mode_extends_the_buffer_with_whole_episodes() -> None:
    class Episodes:
        def __init__(self) -> None:
            self.batches: list[TensorDictBase] = []

        def extend(self, batch: TensorDictBase) -> None:
            self.batches.append(batch)

    buffer = Episodes()
    async with Collector(_env, frames_per_batch=8, total_frames=64, trajs_per_batch=3) as collector:
        collector.start(buffer)
        await wait_until(lambda: not collector.running_in_background, timeout=60)
    _check_whole_episodes(buffer.batches, 3, 64, {0: 3, ENV_STRIDE: 5})


async def test_episodes_given_up_by_a_reset_at_each_batch_are_handed_out_truncated() -> None:
    collector = Collector(functools.partial(_env, 0, [5, 5]), frames_per_batch=8, total_frames=32,
                          trajs_per_batch=2, reset_at_each_iter=True)  # fmt: skip
    batches, collected = [], []
    async with collector:
        async for batch in collector:
            batches.append(batch)
            collected.append(collector.frames)
    # Each batch's episodes are known to be given up as soon as the next batch comes, not at the end.
    assert collected == [16, 24, 32, 32]
    trajs = [traj for batch in batches for traj in _trajectories(batch)]
    assert sum(traj.shape[0] for traj in trajs) == 32
    for traj in trajs:  # 4 steps a batch: each episode is cut by the next batch's reset
        _check_run(traj)
        assert traj.shape[0] == 4
        assert traj["next", "truncated"][-1].all()


@pytest.mark.parametrize("value", [0, -1, "3", 2.0, True])
def test_bad_values_are_refused_naming_the_option(value: object) -> None:
    with pytest.raises(ConfigurationError, match="trajs_per_batch"):
        Collector(_env, frames_per_batch=8, trajs_per_batch=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="trajs_per_batch"):
        MultiAsyncCollector([_env], frames_per_batch=8, trajs_per_batch=value)  # type: ignore[arg-type]


def test_split_trajs_and_a_policy_lag_limit_are_refused_with_it() -> None:
    with pytest.raises(ConfigurationError, match=r"split_trajs=True.*trajs_per_batch"):
        Collector(_env, frames_per_batch=8, trajs_per_batch=2, split_trajs=True)
    with pytest.raises(ConfigurationError, match=r"max_policy_lag=1.*trajs_per_batch"):
        MultiAsyncCollector([_env], frames_per_batch=8, trajs_per_batch=2, max_policy_lag=1)


def test_a_collector_of_whole_episodes_has_no_length() -> None:
    with pytest.raises(TypeError, match="trajs_per_batch"):
        len(Collector(_env, frames_per_batch=8, total_frames=64, trajs_per_batch=2))


def test_the_assembler_keeps_the_pieces_of_one_episode_from_several_workers_apart() -> None:
    # Two workers (ids 0, 2, 4... and 1, 3, 5...): worker 1's batch does not end worker 0's open episode.
    def batch(obs: list[int], ids: list[int], done: list[bool]) -> TensorDictBase:
        from tensordict import TensorDict

        td = TensorDict({"obs": torch.tensor([obs]), ("collector", "traj_ids"): torch.tensor([ids])}, [1, len(obs)])
        td.set(("next", "done"), torch.tensor([done]).unsqueeze(-1))
        td.set(("next", "truncated"), torch.zeros(1, len(obs), 1, dtype=torch.bool))
        return td

    assembler = TrajectoryAssembler(workers=2)
    assembler.add(batch([0, 1], [0, 0], [False, False]))
    assembler.add(batch([10, 11], [1, 1], [False, True]))
    assert (assembler.complete, assembler.in_progress) == (1, 1)
    assembler.add(batch([2, 3], [0, 0], [False, True]))
    out = assembler.take(2)
    assert out["obs"].tolist() == [[10, 11, 0, 0], [0, 1, 2, 3]]
    # Worker 0 again, without its open episode 4: given up (its env was reset), handed out truncated.
    assembler.add(batch([4, 5], [4, 4], [False, False]))
    assembler.add(batch([7], [6], [False]))
    assert (assembler.complete, assembler.in_progress) == (1, 1)
    cut = assembler.take(1)
    assert cut["obs"].tolist() == [[4, 5]]
    assert cut["next", "truncated"].squeeze(-1).tolist() == [[False, True]]
    assert assembler.flush() == 1
    assert assembler.take(1)["obs"].tolist() == [[7]]
    assert assembler.empty
