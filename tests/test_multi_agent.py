"""Multi-agent envs through every collector on one machine: groups of agents under nested keys, every frame checked.

:class:`~acollect.testing.GroupCountingEnv`'s observations count steps and echo each agent's last action, and its
rewards are a function of the actions, so :func:`~acollect.testing.assert_group_counting_batch` tells, frame by
frame and agent by agent, that nothing was lost, repeated or made up on the way through workers, shared memory,
an inference server and the hand-out. The distributed and Ray collectors have theirs beside their other tests.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from acollect.errors import PolicyError
from acollect.testing import GroupCountingEnv, assert_group_counting_batch, no_leaks

START = {"start_method": "forkserver"}
ENV = functools.partial(GroupCountingEnv, num_envs=2, episode_length=[3, 4])
GROUPS = ("red", "blue")


class GroupProbe(torch.nn.Module):
    """Every agent of the group takes action ``round(w)``: the actions show which weights chose them."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([float(value)]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).round().clamp(0, 2).long()


def group_policy(red: float = 0.0, blue: float = 1.0) -> TensorDictSequential:
    """Reads ``(group, "observation")`` and writes ``(group, "action")`` for each group."""
    return TensorDictSequential(
        *(
            TensorDictModule(GroupProbe(value), in_keys=[(group, "observation")], out_keys=[(group, "action")])
            for group, value in (("red", red), ("blue", blue))
        )
    )


def _collector(kind: type, policy: Any, **kwargs: Any) -> Any:
    if kind in (Collector, AsyncCollector):
        return kind(ENV, policy, **kwargs) if kind is Collector else kind(ENV, policy, **kwargs, **START)
    return kind([ENV, ENV], policy, **kwargs, **START)


def _rows(batch: TensorDictBase) -> TensorDictBase:
    return batch.reshape(-1, batch.shape[-1])  # MultiSync stacks workers before the envs


@pytest.mark.parametrize(
    "kind", [Collector, MultiSyncCollector, MultiAsyncCollector, AsyncCollector, AsyncBatchedCollector]
)
async def test_every_frame_of_every_agent_is_real_through_every_collector(kind: type) -> None:
    policy = group_policy(1.0, 2.0) if kind is AsyncBatchedCollector else None  # a server runs a given policy
    with no_leaks():
        async with _collector(kind, policy, frames_per_batch=16, total_frames=96) as collector:
            ids: set[int] = set()
            async for batch in collector:
                assert batch.get(("red", "action")).shape[-1] == 2
                assert batch.get(("blue", "action")).shape[-1] == 1
                assert batch.get(("next", "red", "reward")).shape[-2:] == (2, 1)
                assert batch.get(("red", "action")).dtype == torch.int64
                assert_group_counting_batch(_rows(batch))
                ids.update(batch["collector", "traj_ids"].unique().tolist())
            stats = collector.stats()
    assert stats.frames == 96
    assert stats.episodes > 0
    assert set(stats.group_return_mean) == set(GROUPS)
    assert stats.episode_return_mean == pytest.approx(sum(stats.group_return_mean.values()))
    assert len(ids) >= stats.episodes  # every episode its own trajectory id


async def test_episode_returns_are_summed_over_each_groups_agents() -> None:
    # red's two agents take action 1: 10 + 11 a step; blue's one takes 2: 20 a step; episodes of 3 steps.
    env = functools.partial(GroupCountingEnv, num_envs=2, episode_length=3)
    async with Collector(env, group_policy(1.0, 2.0), frames_per_batch=12, total_frames=24) as collector:
        async for _ in collector:
            pass
        stats = collector.stats()
    assert stats.episodes == 8
    assert stats.group_return_mean == {"red": 63.0, "blue": 60.0}
    assert stats.episode_return_mean == 123.0
    assert stats.episode_length_mean == 3


@pytest.mark.parametrize("kind", [Collector, MultiSyncCollector, AsyncBatchedCollector])
async def test_every_frame_acts_with_the_group_weights_of_its_version(kind: type) -> None:
    policy = group_policy(0.0, 1.0)
    seen: dict[int, set[tuple[int, int]]] = {}
    async with _collector(kind, policy, frames_per_batch=16, total_frames=16 * 8) as collector:
        async for batch in collector:
            assert_group_counting_batch(_rows(batch))
            versions = batch["collector", "policy_version"].reshape(-1)
            red = batch["red", "action"].reshape(versions.numel(), -1)
            blue = batch["blue", "action"].reshape(versions.numel(), -1)
            for v, r, b in zip(versions.tolist(), red[:, 0].tolist(), blue[:, 0].tolist(), strict=True):
                seen.setdefault(v, set()).add((r, b))
            if collector.stats().batches == 2:
                await collector.update_policy_weights_(group_policy(2.0, 0.0))
    assert seen[0] == {(0, 1)}
    assert seen[1] == {(2, 0)}  # each group's own weights, from the frame the version says on


async def test_truncation_at_max_frames_per_traj_ends_every_groups_episode() -> None:
    env = functools.partial(GroupCountingEnv, num_envs=2, episode_length=50)
    async with Collector(env, None, frames_per_batch=16, total_frames=48, max_frames_per_traj=4) as collector:
        async for batch in collector:
            assert_group_counting_batch(batch)  # the groups' flags are the root's: truncated at every 4th step
            truncated = batch["next", "truncated"].squeeze(-1)
            assert truncated[:, 3::4].all()
            assert int(truncated.sum()) == 4
            assert batch["next", "red", "truncated"][:, 3].all()


async def test_whole_episodes_keep_every_groups_keys() -> None:
    env = functools.partial(GroupCountingEnv, num_envs=2, episode_length=[3, 5])
    async with MultiSyncCollector([env, env], None, frames_per_batch=16, trajs_per_batch=4, **START) as collector:
        batch = await anext(collector)
    assert batch.shape[0] == 4
    for traj in batch.unbind(0):
        length = int(traj["collector", "mask"].sum())
        assert length in (3, 5)
        whole = traj[:length]
        assert_group_counting_batch(whole.unsqueeze(0))
        assert whole["next", "red", "done"][-1].all()
        assert not whole["next", "red", "done"][:-1].any()


async def test_the_same_seed_gives_the_same_multi_agent_batches() -> None:
    async def run() -> list[TensorDictBase]:
        async with MultiSyncCollector([ENV, ENV], None, frames_per_batch=16, total_frames=48, **START) as collector:
            collector.set_seed(7)
            return [batch.clone() async for batch in collector]

    first, second = await run(), await run()
    for a, b in zip(first, second, strict=True):
        for group in GROUPS:
            assert torch.equal(a[group, "action"], b[group, "action"])
    assert not torch.equal(first[0]["red", "action"], first[1]["red", "action"])  # random, not constant


async def test_a_policy_missing_a_groups_action_is_named() -> None:
    only_red = TensorDictModule(GroupProbe(0.0), in_keys=[("red", "observation")], out_keys=[("red", "action")])
    with pytest.raises(PolicyError, match=r"did not write \('blue', 'action'\)"):
        async with Collector(ENV, only_red, frames_per_batch=8, total_frames=8) as collector:
            await anext(collector)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda b: b[("red", "action")][0, 2, 1].add_(1), "does not echo the action"),
        (lambda b: b[("next", "blue", "reward")][1, 0].add_(1), "not the action's"),
        (lambda b: b[("next", "red", "done")][0, 0].fill_(True), "is not the root flag"),
        (lambda b: b[("blue", "observation")][1, 5, 0, 0].add_(1), "real transition"),
        (lambda b: b[("next", "red", "observation")][0, 1, 1, 0].sub_(1), "real transition"),
    ],
)
async def test_the_frame_check_catches_a_spoilt_frame(spoil: Any, message: str) -> None:
    async with Collector(ENV, None, frames_per_batch=16, total_frames=16) as collector:
        batch = (await anext(collector)).clone()
    assert_group_counting_batch(batch)
    spoil(batch)
    with pytest.raises(AssertionError, match=message):
        assert_group_counting_batch(batch)


class CrashingGroupEnv(GroupCountingEnv):
    """Raises at the 7th step of each life: a rebuilt env does so again."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps = 0

    def step_and_reset_into(self, action: Any, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self.steps += 1
        if self.steps == 7:
            raise RuntimeError("the simulator fell over")
        super().step_and_reset_into(action, next_out, root_out)


def test_an_env_rebuilt_after_a_fault_ends_every_groups_episode_truncated() -> None:
    from acollect._rollout.build import build_engine
    from acollect._rollout.spec import RolloutSpec

    spec = RolloutSpec(
        create_env_fn=CrashingGroupEnv, env_kwargs={"num_envs": 2, "episode_length": 50},
        frames_per_batch=20, env_errors="restart",
    )  # fmt: skip
    engine = build_engine(spec, blocking=True)
    try:
        batch = engine.collect()
        assert engine.env_restarts == 1
    finally:
        engine.close()
    # Steps 1-6 recorded (frames 0-5), step 7 raised, frame 6 is the rebuilt env's first.
    assert_group_counting_batch(batch[:, :6])
    assert_group_counting_batch(batch[:, 6:])
    for group in GROUPS:
        assert batch["next", group, "truncated"][:, 5].all()
        assert batch["next", group, "done"][:, 5].all()
        assert not batch["next", group, "truncated"][:, :5].any()
        assert not batch["next", group, "terminated"][:, 5].any()
    assert batch["red", "observation"][:, 6, :, 0].tolist() == [[0.0, 0.0], [float(1_000_000)] * 2]
