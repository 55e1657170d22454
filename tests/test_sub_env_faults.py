"""A sub-env that raises is rebuilt alone (``env_errors="restart"``): its episode ends truncated where the fault
was, its neighbours' episodes go on step after step, and a seeded run with the same faults repeats exactly."""

from __future__ import annotations

import functools
import logging
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from tensordict import TensorDictBase

from acollect import Collector, MultiSyncCollector
from acollect._rollout.build import build_engine
from acollect._rollout.spec import RolloutSpec
from acollect.envs import GymEnv
from acollect.testing import ENV_STRIDE, CountingGymEnv, assert_counting_batch

N_ENVS, FAULTY, CRASH_AT = 4, 2, 7


class CrashingCounter(CountingGymEnv):
    """A counting sub-env that raises at the ``crash_at``-th step of its life (``None``: never)."""

    def __init__(self, episode_length: int = 5, *, start: int = 0, crash_at: int | None = None) -> None:
        super().__init__(episode_length, start=start)
        self.crash_at, self.life = crash_at, 0

    def step(self, action: Any) -> Any:
        self.life += 1
        if self.life == self.crash_at:
            raise RuntimeError(f"sub-env starting at {self.counter - self._in_episode} fell over")
        return super().step(action)


def counters(crash_at: int | None = CRASH_AT, faulty: int = FAULTY) -> GymEnv:
    """4 counting sub-envs (sub-env ``i`` from ``i * ENV_STRIDE``), of which ``faulty`` raises at ``crash_at``."""
    fns = [
        functools.partial(CrashingCounter, 5, start=i * ENV_STRIDE, crash_at=crash_at if i == faulty else None)
        for i in range(N_ENVS)
    ]
    return GymEnv(SyncVectorEnv(fns))


def _engine(**kwargs: Any) -> Any:
    spec = RolloutSpec(create_env_fn=counters, frames_per_batch=N_ENVS * 10, env_errors="restart", **kwargs)
    return build_engine(spec, blocking=True)


def _check_neighbours(batch: TensorDictBase, faulty: int = FAULTY) -> None:
    """The other sub-envs' rows: real, gap-free steps from start to end, never truncated."""
    others = [i for i in range(batch.shape[0]) if i != faulty]
    assert_counting_batch(batch[others])
    assert not batch["next", "truncated"][others].any()


def test_the_sub_env_that_raised_is_rebuilt_alone_and_its_neighbours_step_on() -> None:
    engine = _engine()
    try:
        sub_envs = list(engine.env.env.envs)  # the GymEnv's SyncVectorEnv's
        batch = engine.collect()
        assert engine.env_restarts == 1
        after = engine.env.env.envs
        assert [a is b for a, b in zip(sub_envs, after, strict=True)] == [True, True, False, True]
    finally:
        engine.close()
    _check_neighbours(batch)
    row = batch[FAULTY]
    obs = row["observation"].squeeze(-1)
    # Steps 1-6 of its first life are frames 0-5; step 7 raised; frame 6 is the rebuilt sub-env's first step.
    assert_counting_batch(row[:6].unsqueeze(0))
    assert_counting_batch(row[6:].unsqueeze(0))
    assert obs[6].item() == FAULTY * ENV_STRIDE  # the new sub-env's first observation
    assert row["next", "observation"][6].item() == FAULTY * ENV_STRIDE + 1  # and a real step from it
    truncated, done = row["next", "truncated"].squeeze(-1), row["next", "done"].squeeze(-1)
    assert truncated.tolist() == [False] * 5 + [True] + [False] * 4  # the episode in flight ends where it was
    assert done[5]
    assert not row["next", "terminated"].squeeze(-1)[5]
    ids = batch["collector", "traj_ids"]
    assert ids[FAULTY, 6] > ids[:, :6].max()  # a new trajectory, never seen before
    assert (ids[FAULTY, 6:] == ids[FAULTY, 6]).all()


def test_a_fault_at_a_batchs_first_step_gives_a_new_trajectory_id() -> None:
    engine = _engine()
    try:
        first = engine.collect()
        second = engine.collect()  # its life's 7th step is step 3 of this batch: frames 0-2 are its steps 4-6
        third = engine.collect()
    finally:
        engine.close()
    for batch in (first, second, third):
        _check_neighbours(batch)
    assert engine.env_restarts >= 2


def test_a_reset_that_fails_after_an_episode_ended_keeps_the_step_and_rebuilds_the_sub_env() -> None:
    class ResetFails(CrashingCounter):
        def reset(self, **kwargs: Any) -> Any:
            if self._in_episode == self.episode_length and not getattr(self, "failed", False):
                self.failed = True  # once in each life: after its first episode ended
                raise ConnectionError("the simulator dropped the reset")
            return super().reset(**kwargs)

    def make() -> GymEnv:
        fns = [functools.partial(ResetFails if i == 1 else CrashingCounter, 5, start=i * ENV_STRIDE) for i in range(2)]
        return GymEnv(SyncVectorEnv(fns))

    spec = RolloutSpec(create_env_fn=make, frames_per_batch=2 * 8, env_errors="restart")
    engine = build_engine(spec, blocking=True)
    try:
        batch = engine.collect()
        assert engine.env_restarts == 1
    finally:
        engine.close()
    row = batch[1]
    assert_counting_batch(row[:5].unsqueeze(0))
    assert row["next", "terminated"].squeeze(-1)[4]  # its episode ended by itself: nothing cut
    assert not row["next", "truncated"].any()
    assert row["observation"][5].item() == ENV_STRIDE  # the rebuilt sub-env's first observation
    assert_counting_batch(batch[:1])


def test_the_warning_names_the_sub_env_and_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine()
    try:
        with caplog.at_level(logging.WARNING, logger="acollect"):
            engine.collect()
    finally:
        engine.close()
    message = next(r.getMessage() for r in caplog.records if "raised" in r.getMessage())
    assert message.startswith(f"sub-env {FAULTY} raised RuntimeError: sub-env starting at 20002")
    assert "rebuilding it alone" in message


class OwnSyncVectorEnv(SyncVectorEnv):
    """A vector env of the user's own (a subclass may step its sub-envs its own way): stepped whole."""


def test_an_env_that_cannot_rebuild_one_sub_env_is_rebuilt_whole_and_the_warning_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def make() -> GymEnv:
        fns = [
            functools.partial(CrashingCounter, 5, start=i * ENV_STRIDE, crash_at=7 if i == 1 else None)
            for i in range(2)
        ]
        return GymEnv(OwnSyncVectorEnv(fns))

    spec = RolloutSpec(create_env_fn=make, frames_per_batch=2 * 10, env_errors="restart")
    engine = build_engine(spec, blocking=True)
    try:
        with caplog.at_level(logging.WARNING, logger="acollect"):
            batch = engine.collect()
    finally:
        engine.close()
    message = next(r.getMessage() for r in caplog.records if "raised" in r.getMessage())
    assert "rebuilding it whole" in message
    assert "GymEnv cannot rebuild one sub-env alone" in message
    assert batch["next", "truncated"].squeeze(-1)[:, 5].all()  # every sub-env's episode in flight was cut


async def test_the_in_process_collector_rebuilds_one_sub_env_and_counts_it() -> None:
    async with Collector(counters, frames_per_batch=N_ENVS * 10, total_frames=N_ENVS * 30, env_errors="restart") as c:
        batches = [b.clone() async for b in c]
        stats = c.stats()
    assert stats.env_restarts == 4  # lives of 6 good steps: faults at steps 7, 13, 19, 25 of 30
    assert stats.env_restarts_by_sub_env == {0: {FAULTY: 4}}  # which sub-env of which worker
    whole = torch.cat(batches, dim=1)
    _check_neighbours(whole)  # across batch boundaries too


async def test_workers_rebuild_one_sub_env_and_the_neighbours_go_on() -> None:
    async with MultiSyncCollector(
        [counters, counters], frames_per_batch=2 * N_ENVS * 10, total_frames=2 * N_ENVS * 30, env_errors="restart",
        start_method="forkserver",
    ) as collector:  # fmt: skip
        batches = [b.clone() async for b in collector]
        stats = collector.stats()
    assert stats.env_restarts == 8
    assert stats.env_restarts_by_sub_env == {0: {FAULTY: 4}, 1: {FAULTY: 4}}
    whole = torch.cat(batches, dim=-1)
    for worker in range(2):
        _check_neighbours(whole[worker])


async def test_whole_episodes_of_the_neighbours_stay_whole() -> None:
    async with Collector(counters, frames_per_batch=N_ENVS * 10, trajs_per_batch=12, env_errors="restart") as c:
        batch = await anext(c)
    for traj in batch.unbind(0):
        length = int(traj["collector", "mask"].sum())
        frames = traj[:length]
        assert_counting_batch(frames.unsqueeze(0))
        start = int(frames["observation"][0].item())
        if start // ENV_STRIDE != FAULTY:
            assert length == 5  # every neighbour's episode whole: 5 steps, terminated
            assert frames["next", "terminated"][-1].all()


class CrashingCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole (random first states) that raises at the 9th step of each life."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.life = 0

    def step(self, action: Any) -> Any:
        self.life += 1
        if self.life == 9:
            raise RuntimeError("the physics blew up")
        return self.env.step(action)


def cartpoles() -> GymEnv:
    return GymEnv(SyncVectorEnv([lambda: gym.make("CartPole-v1"), CrashingCartPole, lambda: gym.make("CartPole-v1")]))


async def test_a_seeded_run_with_the_same_faults_repeats_exactly() -> None:
    async def run(seed: int) -> TensorDictBase:
        async with Collector(cartpoles, frames_per_batch=3 * 20, total_frames=3 * 60, env_errors="restart") as c:
            c.set_seed(seed)
            batches = [b.clone() async for b in c]
            assert c.stats().env_restarts >= 5
        return torch.cat(batches, dim=1)

    first, again, other = await run(3), await run(3), await run(4)
    assert torch.equal(first["observation"], again["observation"])
    assert torch.equal(first["action"], again["action"])
    assert torch.equal(first["collector", "traj_ids"], again["collector", "traj_ids"])
    # The rebuilt sub-env's first states come from its own seeds, not from one fixed state.
    rebuilt = first["observation"][1][first["next", "truncated"][1].squeeze(-1).roll(1)]
    assert len({tuple(np.round(x.tolist(), 6)) for x in rebuilt}) == len(rebuilt)
    assert not torch.equal(first["observation"], other["observation"])


def test_a_batch_whose_first_reset_fails_is_stepped_by_the_rebuilt_env(caplog: pytest.LogCaptureFixture) -> None:
    class SecondResetFails(CrashingCounter):
        """Every sub-env's second reset raises: the engine's reset at its first batch, then an episode's end."""

        def reset(self, **kwargs: Any) -> Any:
            self.resets = getattr(self, "resets", 0) + 1
            if self.resets == 2:
                raise ConnectionError("the simulator dropped the reset")
            return super().reset(**kwargs)

    def make() -> GymEnv:
        return GymEnv(SyncVectorEnv([functools.partial(SecondResetFails, 5, start=i * ENV_STRIDE) for i in range(2)]))

    engine = build_engine(RolloutSpec(create_env_fn=make, frames_per_batch=16, env_errors="restart"), blocking=True)
    try:
        with caplog.at_level(logging.WARNING, logger="acollect"):
            batch = engine.collect()
    finally:
        engine.close()
    raised = [r.getMessage().split(";")[0] for r in caplog.records if "raised" in r.getMessage()]
    # The whole env once (its reset), then each rebuilt sub-env alone at its own second reset: never the env
    # that was closed (the steps used to go on with it).
    assert raised == ["the env raised ConnectionError: the simulator dropped the reset"] + [
        f"sub-env {i} raised ConnectionError: the simulator dropped the reset" for i in (0, 1)
    ]
    assert_counting_batch(batch[:, :5])


async def test_batches_ahead_of_a_multi_async_collector_keep_each_workers_neighbours_whole() -> None:
    from acollect import MultiAsyncCollector

    streams: dict[int, list[TensorDictBase]] = {0: [], 1: []}
    async with MultiAsyncCollector(
        [counters, counters], frames_per_batch=N_ENVS * 10, total_frames=N_ENVS * 10 * 8, env_errors="restart",
        credits=2, start_method="forkserver",
    ) as collector:  # fmt: skip
        async for batch in collector:
            streams[int(batch["collector", "worker_id"][0, 0])].append(batch.clone())
        stats = collector.stats()
    restarts = 0
    for worker, batches in streams.items():
        whole = torch.cat(batches, dim=1)
        _check_neighbours(whole)  # each worker's stream, in its order, across the batches it ran ahead
        restarts += int(whole["next", "truncated"][FAULTY].sum())
        assert set(stats.env_restarts_by_sub_env.get(worker, {})) <= {FAULTY}
    assert stats.env_restarts >= restarts > 0


async def test_env_groups_of_central_inference_rebuild_one_sub_env_alone() -> None:
    from tensordict.nn import TensorDictModule

    from acollect import AsyncBatchedCollector

    policy = TensorDictModule(lambda obs: (obs[..., 0] * 0).long(), in_keys=["observation"], out_keys=["action"])
    async with AsyncBatchedCollector(
        [counters], policy, frames_per_batch=N_ENVS * 10, total_frames=N_ENVS * 30, env_errors="restart",
        env_groups=1, server="thread", start_method="forkserver",
    ) as collector:  # fmt: skip
        batches = [b.clone() async for b in collector]
        stats = collector.stats()
    assert stats.env_restarts == 4
    assert stats.env_restarts_by_sub_env == {0: {FAULTY: 4}}
    _check_neighbours(torch.cat(batches, dim=-1).reshape(N_ENVS, -1))


def _row_engine(crash_at: int, episode_length: int = 50, **kwargs: Any) -> Any:
    """An engine of 4 counting sub-envs of ``episode_length`` steps, sub-env 2 raising at step ``crash_at`` of each
    life; 10 steps a batch."""

    def make() -> GymEnv:
        fns = [
            functools.partial(
                CrashingCounter, episode_length, start=i * ENV_STRIDE, crash_at=crash_at if i == FAULTY else None
            )
            for i in range(N_ENVS)
        ]
        return GymEnv(SyncVectorEnv(fns))

    spec = RolloutSpec(create_env_fn=make, frames_per_batch=N_ENVS * 10, env_errors="restart", **kwargs)
    return build_engine(spec, blocking=True)


def _truncated_at(batch: TensorDictBase) -> list[int]:
    return batch["next", "truncated"][FAULTY].squeeze(-1).nonzero().flatten().tolist()


def test_a_fault_at_a_batchs_second_step_cuts_its_first() -> None:
    engine = _row_engine(crash_at=12)  # step 12 of its life: the second step of the second batch
    try:
        first, second = engine.collect(), engine.collect()
    finally:
        engine.close()
    assert _truncated_at(first) == []
    assert _truncated_at(second) == [0]
    ids = second["collector", "traj_ids"][FAULTY]
    assert ids[1] != ids[0]
    assert second["observation"][FAULTY, 1].item() == FAULTY * ENV_STRIDE


def test_a_fault_just_after_an_episode_ended_by_itself_cuts_nothing() -> None:
    engine = _row_engine(crash_at=6, episode_length=5)  # the first step of its second episode raises
    try:
        batch = engine.collect()
    finally:
        engine.close()
    row = batch[FAULTY]
    assert row["next", "terminated"].squeeze(-1)[4]  # its first episode's own end
    assert _truncated_at(batch) == []  # nothing in flight to cut
    assert row["observation"][5].item() == FAULTY * ENV_STRIDE  # the rebuilt sub-env's first step


def test_a_rebuilt_sub_env_is_truncated_after_max_frames_per_traj_of_its_own() -> None:
    engine = _row_engine(crash_at=6, max_frames_per_traj=4)
    try:
        batch = engine.collect()
    finally:
        engine.close()
    # Cut at its 4th step (frame 3), then the fault at its 6th (frame 5) cuts the next episode at frame 4, and the
    # rebuilt sub-env's episode, begun at frame 5, is cut after 4 steps of its own: at frame 8.
    assert _truncated_at(batch) == [3, 4, 8]
    _check_neighbours_cut_every(batch, 4)


def _check_neighbours_cut_every(batch: TensorDictBase, steps: int) -> None:
    others = [i for i in range(N_ENVS) if i != FAULTY]
    truncated = batch["next", "truncated"][others].squeeze(-1)
    assert truncated[:, steps - 1 :: steps].all()
    assert int(truncated.sum()) == len(others) * (10 // steps)


async def test_an_action_outside_the_space_is_the_policys_fault_even_with_restarts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    def goes_wrong(td: TensorDictBase) -> TensorDictBase:
        nonlocal calls
        calls += 1
        action = torch.zeros(td.batch_size, dtype=torch.int64)
        return td.set("action", action + (7 if calls > 3 else 0))  # valid at the probe, then outside Discrete(2)

    from acollect.errors import PolicyError

    make = functools.partial(GymEnv, "CartPole-v1", num_envs=2)
    with caplog.at_level(logging.WARNING, logger="acollect"), pytest.raises(PolicyError, match="outside the action"):
        async with Collector(make, goes_wrong, frames_per_batch=20, env_errors="restart") as collector:
            await anext(collector)
    assert collector.stats().env_restarts == 0
    assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]  # no sub-env rebuilt, not even tried


def test_a_rebuilt_sub_env_starts_from_its_own_seed() -> None:
    from acollect.envs._gym_faults import rebuild_seed

    spec = RolloutSpec(create_env_fn=cartpoles, frames_per_batch=3 * 10, env_errors="restart")
    engine = build_engine(spec, blocking=True)
    try:
        engine.seed(3)
        batch = engine.collect()
    finally:
        engine.close()
    # Sub-env 1 raises at its 9th step: frame 8 is its first rebuild's first step, from SeedSequence([3, 1, 1]).
    expected, _ = gym.make("CartPole-v1").reset(seed=rebuild_seed(3, 1, 1))
    assert np.allclose(batch["observation"][1, 8].numpy(), expected)
    assert batch["next", "truncated"][1, 7].item()
