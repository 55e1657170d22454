"""The rollout engines: each an :class:`~acollect._rollout.engine.Engine`, all made by the one builder.

The collectors and the worker processes use an engine through the protocols of :mod:`acollect._rollout.engine`
only, so
each class is checked against them here, on a built engine (mypy checks the same where the engines are built);
then :func:`~acollect._rollout.build.build_engine`: which engine it picks, what it refuses, and that it closes
what it built when it fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import torch

from acollect._devices import resolve_devices
from acollect._policy import RandomPolicy
from acollect._rollout.blocking import RolloutEngine
from acollect._rollout.build import build_engine
from acollect._rollout.coroutines import AsyncRollout
from acollect._rollout.engine import BlockingEngine, Engine
from acollect._rollout.groups import EngineGroups
from acollect._rollout.own_loop import LoopRollout
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.tasks import TaskOwner
from acollect.envs import AsyncEnvPool
from acollect.errors import ConfigurationError, PolicyError
from acollect.testing import AsyncCountingEnv, CountingEnv, SplitProbe


def rollout_engine(policy: Any = None, num_envs: int = 2) -> RolloutEngine:
    """An engine of 4 steps a batch."""
    env = CountingEnv(num_envs=num_envs)
    return RolloutEngine(env, policy or RandomPolicy(env.action_spec, env.batch_size), time_steps=4,
                         devices=resolve_devices())  # fmt: skip


def async_rollout() -> AsyncRollout:
    pool = AsyncEnvPool(AsyncCountingEnv, num_envs=2)
    return AsyncRollout(pool, RandomPolicy(pool.action_spec, (2,)), time_steps=4, devices=resolve_devices())


@pytest.fixture
def blocking_engines() -> Iterator[dict[str, BlockingEngine]]:
    engines: dict[str, BlockingEngine] = {
        "RolloutEngine": rollout_engine(),
        "LoopRollout": LoopRollout(async_rollout()),
        "EngineGroups": EngineGroups([rollout_engine(SplitProbe(), 1), rollout_engine(SplitProbe(), 1)]),
    }
    yield engines
    for engine in engines.values():
        engine.close()


def test_every_blocking_engine_is_a_blocking_engine_and_collects_through_it(
    blocking_engines: dict[str, BlockingEngine],
) -> None:
    assert set(blocking_engines) == {"RolloutEngine", "LoopRollout", "EngineGroups"}
    for name, engine in blocking_engines.items():
        assert isinstance(engine, Engine), name
        assert isinstance(engine, BlockingEngine), name
        layout = engine.allocate()
        batch = engine.collect(out=layout)  # through the protocol's own signature
        assert batch is layout, name
        assert batch.batch_size == (2, 4), name
        assert (engine.frames, engine.in_batch) == (8, False), name
        assert engine.steps > 0, name
        engine.policy_version, engine.next_traj_counter = 3, 10
        assert (engine.policy_version, engine.next_traj_counter) == (3, 10), name


def test_the_coroutine_env_engine_is_an_engine_driven_on_a_loop_not_a_blocking_one() -> None:
    async def main() -> None:
        engine = async_rollout()
        tasks = TaskOwner("test", on_failure=print)
        tasks.ensure_group()
        try:
            assert isinstance(engine, Engine)
            assert not isinstance(engine, BlockingEngine)  # no allocate() or close(): the loop's coroutines
            await engine.ensure_running(tasks.spawn)
            await engine.collect(tasks.spawn)
            assert engine.frames == 8
        finally:
            await engine.aclose()
            await tasks.aclose(5.0)

    anyio.run(main)


def test_an_object_lacking_part_of_the_surface_is_no_engine() -> None:
    engine = rollout_engine()
    try:

        class NoRestart:
            def __getattr__(self, name: str) -> Any:
                if name == "restart":
                    raise AttributeError(name)
                return getattr(engine, name)

        assert isinstance(engine, BlockingEngine)
        assert not isinstance(NoRestart(), Engine)
    finally:
        engine.close()


# -- the one builder -----------------------------------------------------------------------------------


class Built:
    """Env and policy factories that keep what they built, to see what is closed."""

    def __init__(self) -> None:
        self.envs: list[Any] = []
        self.policies: list[ClosingProbe] = []

    def env(self, **kwargs: Any) -> CountingEnv:
        env = CountingEnv(**kwargs)
        self.envs.append(env)
        return env

    def pool(self, num_envs: int = 2) -> AsyncEnvPool:
        pool = AsyncEnvPool(AsyncCountingEnv, num_envs)
        self.envs.append(pool)
        return pool

    def remote(self, group: int) -> ClosingProbe:
        policy = ClosingProbe(group)
        self.policies.append(policy)
        return policy


class ClosingProbe(SplitProbe):
    """A split policy that says whether it was closed (an inference server's client holds a connection)."""

    def __init__(self, group: int, *, answers: bool = True) -> None:
        super().__init__(0)
        self.group, self.answers, self.closed = group, answers, False

    def receive(self) -> dict[Any, Any]:
        return super().receive() if self.answers else {}

    def close(self) -> None:
        self.closed = True


def spec(create_env_fn: Any, **kwargs: Any) -> RolloutSpec:
    return RolloutSpec(create_env_fn=create_env_fn, **{"frames_per_batch": 8, **kwargs})


def test_the_builder_picks_the_engine_for_the_env_and_the_caller() -> None:
    built = Built()
    two, three = spec(built.env, env_kwargs={"num_envs": 2}), spec(built.env, env_kwargs={"num_envs": 3})
    cases: list[tuple[Engine, type]] = [
        (build_engine(two, blocking=False), RolloutEngine),
        (build_engine(two, blocking=True), RolloutEngine),
        (build_engine(spec(built.pool), blocking=True), LoopRollout),
        (build_engine(three, blocking=True, remote_policy=built.remote, env_groups=2), EngineGroups),
    ]
    loop_engine = build_engine(spec(built.pool), blocking=False)
    try:
        assert isinstance(loop_engine, AsyncRollout)
        for engine, kind in cases:
            assert type(engine) is kind
            assert isinstance(engine, BlockingEngine)
            assert engine.n_envs in (2, 3)
        groups = cases[-1][0]
        assert isinstance(groups, EngineGroups)
        assert [engine.n_envs for engine in groups.engines] == [2, 1]
        assert [policy.group for policy in built.policies] == [0, 1]  # one client per group
        assert [engine.policy for engine in groups.engines] == built.policies
    finally:
        for engine, _ in cases:
            assert isinstance(engine, BlockingEngine)
            engine.close()
        anyio.run(loop_engine.aclose)
    assert all(env.is_closed for env in built.envs)
    assert all(policy.closed for policy in built.policies)


def test_coroutine_envs_are_one_group_under_central_inference() -> None:
    # Their envs step while the others wait for actions already: a pool split in groups would step in lockstep.
    built = Built()
    engine = build_engine(spec(built.pool, env_kwargs={"num_envs": 4}, frames_per_batch=16), blocking=True,
                          remote_policy=built.remote, env_groups=2)  # fmt: skip
    try:
        assert isinstance(engine, LoopRollout)
        assert engine.n_envs == 4
        assert [policy.group for policy in built.policies] == [0]
        assert engine.collect().batch_size == (4, 4)
    finally:
        engine.close()
    assert [env.num_envs for env in built.envs] == [2, 4]  # the first group's pool, closed at once
    assert all(env.is_closed for env in built.envs)


@pytest.mark.parametrize("blocking", [False, True])
def test_reset_at_each_iter_is_refused_for_coroutine_envs_and_the_pool_closed(blocking: bool) -> None:
    built = Built()
    with pytest.raises(ConfigurationError, match="reset_at_each_iter=True is invalid: expected False with an "):
        build_engine(spec(built.pool, reset_at_each_iter=True), blocking=blocking)
    (pool,) = built.envs
    assert pool.is_closed
    assert all(env.closed for env in pool.envs)


def test_what_was_built_is_closed_when_the_engine_cannot_be_built() -> None:
    built = Built()

    def silent(group: int) -> ClosingProbe:
        policy = ClosingProbe(group, answers=group == 0)  # group 1's policy writes no action: its probe fails
        built.policies.append(policy)
        return policy

    with pytest.raises(PolicyError, match="did not write 'action'"):
        build_engine(spec(built.env, env_kwargs={"num_envs": 2}), blocking=True, remote_policy=silent, env_groups=2)
    assert len(built.envs) == len(built.policies) == 2
    assert all(env.is_closed for env in built.envs), "group 0's engine and group 1's env"
    assert all(policy.closed for policy in built.policies)


@pytest.mark.parametrize(
    ("writes", "match"),
    [
        (lambda td: td.set("other", torch.zeros(2)), "did not write 'action'"),
        (lambda td: td.set("action", torch.zeros(2, 3, dtype=torch.int64)), r"of shape \(2, 3\): expected \(2,\)"),
        (lambda td: td.set("action", torch.full((2,), 7)), "outside the action space: 7 for env 0"),
    ],
    ids=["no action", "a wrong shape", "an action out of range"],
)
@pytest.mark.parametrize("envs", ["batched", "coroutine"])
def test_every_engine_refuses_the_same_policy_outputs(envs: str, writes: Any, match: str) -> None:
    built = Built()
    make_env = built.env if envs == "batched" else built.pool

    def first_batch() -> None:  # coroutine envs' engine probes its policy once their envs are reset: here
        engine = build_engine(spec(make_env, env_kwargs={"num_envs": 2}, policy=writes), blocking=True)
        try:
            engine.collect()
        finally:
            engine.close()

    with pytest.raises(PolicyError, match=match):
        first_batch()
    assert all(env.is_closed for env in built.envs)
