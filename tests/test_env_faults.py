"""Env faults survived in this process (``env_errors="restart"``): the rollout engine and the in-process Collector.

The envs raise at a chosen step of their life (:class:`~acollect.testing.CrashingEnv`,
:class:`~acollect.testing.CrashingGymEnv`), so a rebuilt env raises again at the same step of its own life and
every count is exact: with a crash at step ``k``, an env rebuilt each time takes ``k - 1`` good steps per life,
and after ``S`` batched steps ``(S - 1) // (k - 1)`` rebuilds happened. Counting envs make the frames exact too:
a rebuilt env starts again from its first observation (``ENV_STRIDE * row``).
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDictBase

from acollect import Collector, MultiAsyncCollector
from acollect._rollout.build import build_engine
from acollect._rollout.env_faults import MAX_REBUILDS_IN_A_ROW
from acollect._rollout.spec import RolloutSpec
from acollect.envs import AsyncEnvPool, GymEnv
from acollect.errors import ConfigurationError, EnvError
from acollect.testing import (
    ENV_STRIDE,
    AsyncCountingEnv,
    CountingEnv,
    CrashingEnv,
    CrashingGymEnv,
    assert_counting_batch,
)

DEADLINE = 60.0


def rebuild_starts(batch: TensorDictBase, stride: int = ENV_STRIDE) -> list[int]:
    """The steps of a counting batch ``[n_envs, T]`` where a rebuilt env begins: every row back at its first
    observation (``stride * row``)."""
    obs = batch["observation"].squeeze(-1)
    starts = torch.arange(batch.batch_size[0], dtype=obs.dtype) * stride
    return [t for t in range(1, batch.batch_size[1]) if bool((obs[:, t] == starts).all())]


def assert_pieces_count(batch: TensorDictBase, starts: list[int]) -> None:
    """Between rebuilds, the frames are real gap-free steps (the stream check of the counting envs)."""
    bounds = [0, *starts, batch.batch_size[1]]
    for lo, hi in itertools.pairwise(bounds):
        assert_counting_batch(batch[:, lo:hi])


def test_the_engine_ends_the_episodes_in_flight_truncated_and_goes_on_from_a_rebuilt_env() -> None:
    # crash at step 7 of each life; 5-step episodes; 2 envs; 10 steps per batch
    spec = RolloutSpec(
        create_env_fn=CrashingEnv, env_kwargs={"crash_at_step": 7, "num_envs": 2, "episode_length": 5},
        frames_per_batch=20, env_errors="restart",
    )  # fmt: skip
    engine = build_engine(spec, blocking=True)
    try:
        first_env = engine.env
        batch = engine.collect()
        assert engine.env is not first_env
        assert first_env.is_closed
        assert engine.env_restarts == 1
        # Steps 1-6 are recorded (frames 0-5); step 7 raised and yields no frame; frame 6 is the new env's first.
        assert rebuild_starts(batch) == [6]
        truncated, done = batch["next", "truncated"].squeeze(-1), batch["next", "done"].squeeze(-1)
        terminated = batch["next", "terminated"].squeeze(-1)
        assert truncated[:, 5].all()
        assert done[:, 5].all()
        assert not terminated[:, 5].any()
        assert not truncated[:, :5].any()
        assert not truncated[:, 6:].any()
        assert done[:, 4].all()  # the episode that ended by itself at step 5 keeps its own end
        ids = batch["collector", "traj_ids"]
        assert (ids[:, 6] > ids[:, :6].max()).all()  # new trajectories, never seen before
        assert (ids[:, 6:] == ids[:, 6:7]).all()
        assert_pieces_count(batch, [6])
        assert torch.equal(batch["observation"][:, 6].squeeze(-1), torch.tensor([0.0, ENV_STRIDE]))

        engine.collect()
        assert engine.env_restarts == (20 - 1) // 6
    finally:
        engine.close()


class ResetFailsEnv(CountingEnv):
    """A counting env whose resets of some of its envs (``mask``: an over-long trajectory cut) raise."""

    def reset_into(self, out: Any, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        if mask is not None:
            raise ConnectionError("the simulator dropped the reset")
        super().reset_into(out, mask=mask, seed=seed)


def test_a_failed_reset_keeps_the_step_it_followed_and_rebuilds_the_env() -> None:
    spec = RolloutSpec(
        create_env_fn=ResetFailsEnv, env_kwargs={"num_envs": 2, "episode_length": 100}, frames_per_batch=16,
        max_frames_per_traj=3, env_errors="restart",
    )  # fmt: skip
    engine = build_engine(spec, blocking=True)
    try:
        batch = engine.collect()
        # Every third step cuts the trajectories: the cut's reset raises, the step itself (truncated) is kept.
        assert rebuild_starts(batch) == [3, 6]
        truncated = batch["next", "truncated"].squeeze(-1)
        assert truncated[:, [2, 5]].all()
        assert batch["next", "done"].squeeze(-1)[:, [2, 5]].all()
        assert truncated.sum() == 2 * 2
        assert engine.env_restarts == 2
        assert_pieces_count(batch, [3, 6])
    finally:
        engine.close()


async def test_collector_survives_a_gymnasium_vector_env_that_raises(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="acollect")
    make = functools.partial(GymEnv, functools.partial(CrashingGymEnv, 7, episode_length=5), num_envs=2)
    async with Collector(make, frames_per_batch=20, total_frames=60, env_errors="restart") as collector:
        batches = [batch async for batch in collector]
        stats = collector.stats()
    # 30 batched steps: both sub-envs raise at steps 7, 13, 19, 25 of the stream, and each is rebuilt alone (the
    # sync vector env's sub-envs step one by one), counted one by one
    assert stats.env_restarts == 2 * ((30 - 1) // 6) == 8
    assert stats.frames == 60
    assert collector.stats().env_restarts == 8  # still told after the shutdown
    stream = torch.cat(batches, dim=1)
    starts = rebuild_starts(stream, stride=0)  # each sub-env counts from 0
    assert starts == [6, 12, 18, 24]
    done = stream["next", "done"].squeeze(-1)
    assert all(bool(stream["next", "truncated"].squeeze(-1)[:, t - 1].all()) for t in starts)
    assert all(bool(done[:, t - 1].all()) for t in starts)
    assert_pieces_count(stream, starts)
    faults = [r for r in caplog.records if r.name == "acollect" and r.levelno == logging.WARNING and r.exc_info]
    assert len(faults) == 8
    assert faults[0].getMessage().startswith("sub-env 0 raised RuntimeError: CrashingGymEnv crashed at step 7")
    assert faults[0].exc_info is not None
    assert isinstance(faults[0].exc_info[1], RuntimeError)


async def test_by_default_the_envs_error_breaks_the_collector_as_it_did() -> None:
    collector = Collector(functools.partial(CrashingEnv, 3, 2), frames_per_batch=20)
    with anyio.fail_after(DEADLINE), pytest.raises(RuntimeError, match="CrashingEnv crashed at step 3"):
        async with collector:
            await anext(collector)
    assert collector.stats().env_restarts == 0


async def test_an_env_that_raises_before_its_first_step_each_time_is_given_up_on() -> None:
    collector = Collector(functools.partial(CrashingEnv, 1, 2), frames_per_batch=20, env_errors="restart")
    with anyio.fail_after(DEADLINE), pytest.raises(RuntimeError, match="CrashingEnv crashed at step 1"):
        async with collector:
            await anext(collector)


async def test_an_env_whose_factory_fails_on_rebuild_breaks_the_collector_with_that_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    built: list[int] = []

    def make() -> CrashingEnv:
        built.append(1)
        if len(built) > 1:
            raise OSError("the simulator's licence server is gone")
        return CrashingEnv(4, 2)

    collector = Collector(make, frames_per_batch=20, env_errors="restart")
    with anyio.fail_after(DEADLINE), pytest.raises(OSError, match="licence server is gone"):
        async with collector:
            await anext(collector)
    assert len(built) == 1 + MAX_REBUILDS_IN_A_ROW
    assert any("giving up" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


@pytest.mark.parametrize("collector_cls", [Collector, MultiAsyncCollector])
def test_a_bad_value_is_refused_naming_the_option(collector_cls: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"env_errors='retry' is invalid: expected .*'raise', 'restart'"):
        collector_cls(CountingEnv, frames_per_batch=8, env_errors="retry")


@pytest.mark.parametrize("collector_cls", [Collector, MultiAsyncCollector])
def test_an_env_given_built_cannot_be_restarted(collector_cls: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"env_errors='restart' is invalid: .* needs an env factory"):
        collector_cls(CountingEnv(), frames_per_batch=8, env_errors="restart")


def assert_coroutine_rows(batch: TensorDictBase) -> list[int]:
    """Checks the rows of ``AsyncCountingEnv`` s (the observation counts the steps of the episode) and returns, per
    row, the episodes cut short (truncated, not terminated): every step real, every episode from a reset."""
    obs, nxt = batch["observation"].squeeze(-1), batch["next", "observation"].squeeze(-1)
    done, terminated = batch["next", "done"].squeeze(-1), batch["next", "terminated"].squeeze(-1)
    assert (nxt == obs + 1).all()
    ids = batch["collector", "traj_ids"]
    for t in range(1, batch.batch_size[1]):
        ended = done[:, t - 1]
        assert (obs[ended, t] == 0).all()  # a new episode, from a reset
        assert (ids[ended, t] != ids[ended, t - 1]).all()
        assert (obs[~ended, t] == nxt[~ended, t - 1]).all()  # the same episode goes on
        assert (ids[~ended, t] == ids[~ended, t - 1]).all()
    return (done & ~terminated).sum(dim=1).tolist()


async def test_coroutine_envs_are_rebuilt_one_by_one_by_their_pool() -> None:
    # each env: 5-step episodes, a crash at the 7th step of its life (the first step of its second episode)
    env = functools.partial(AsyncCountingEnv, 5, crash_at_step=7)
    pool = functools.partial(AsyncEnvPool, env, 2)
    async with Collector(pool, frames_per_batch=40, total_frames=80, env_errors="restart") as collector:
        batches = [batch async for batch in collector]
        restarts = collector.stats().env_restarts
    stream = torch.cat(batches, dim=1)
    # 40 steps per env: lives of 6 steps (an episode of 5, then 1 step cut short), the 6 lives begun ending so
    cut = assert_coroutine_rows(stream)
    assert cut == [6, 6]
    assert restarts >= sum(cut)  # the envs step ahead into the next batch: later faults may be counted already
    truncated = stream["next", "truncated"].squeeze(-1)
    assert (stream["next", "observation"].squeeze(-1)[truncated] == 1).all()  # the step before each fault


async def test_a_coroutine_env_that_raises_before_its_first_step_each_time_is_given_up_on() -> None:
    pool = functools.partial(AsyncEnvPool, functools.partial(AsyncCountingEnv, crash_at_step=1), 2)
    with anyio.fail_after(DEADLINE), pytest.raises(EnvError, match="AsyncCountingEnv crashed at step 1"):
        async with Collector(pool, frames_per_batch=8, env_errors="restart") as collector:
            await anext(collector)
