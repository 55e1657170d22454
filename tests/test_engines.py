"""Every rollout engine is an :class:`~acollect.engine.Engine`, and the blocking ones :class:`BlockingEngine`.

The collectors and the worker processes use an engine through these protocols only, so each class is
checked against them here, on a built engine (mypy checks the same where the engines are built).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from acollect._tasks import TaskOwner
from acollect.async_rollout import AsyncRollout
from acollect.devices import resolve_devices
from acollect.engine import BlockingEngine, Engine
from acollect.engine_groups import EngineGroups
from acollect.envs import AsyncEnvPool
from acollect.loop_rollout import LoopRollout
from acollect.policy import RandomPolicy
from acollect.rollout import RolloutEngine
from acollect.testing import AsyncCountingEnv, CountingEnv, SplitProbe


def rollout_engine(policy: Any = None, num_envs: int = 2) -> RolloutEngine:
    """An engine of 4 steps a batch."""
    env = CountingEnv(num_envs=num_envs)
    return RolloutEngine(env, policy or RandomPolicy(env.action_spec, env.batch_size), frames_per_batch=4 * num_envs,
                         devices=resolve_devices())  # fmt: skip


def async_rollout() -> AsyncRollout:
    pool = AsyncEnvPool(AsyncCountingEnv, num_envs=2)
    return AsyncRollout(pool, RandomPolicy(pool.action_spec, (2,)), frames_per_batch=8, devices=resolve_devices())


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
