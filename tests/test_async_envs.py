"""Coroutine envs: AsyncEnv / AsyncEnvPool stepped by the in-process Collector on its event loop.

The lifecycle rules (shutdown, pause, consumers, failures) run for them in ``tests/test_lifecycle.py``
(kind ``AsyncEnvs``); here: the batches, the batching rule, and every kind of bad input.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch

from acollect import Collector, CollectorState, MultiSyncCollector, ReplayBuffer
from acollect.envs import AsyncEnv, AsyncEnvPool, make_env
from acollect.envs import _async_pool as async_pool_module
from acollect.errors import ConfigurationError, EnvError, RemoteError
from acollect.testing import AsyncCountingEnv, WeightProbe, wait_until

pytestmark = pytest.mark.timeout(60)
BACKENDS = ["asyncio", "trio"]


def pool(num_envs: int = 4, **env_kwargs: Any) -> Any:
    return functools.partial(AsyncEnvPool, functools.partial(AsyncCountingEnv, **env_kwargs), num_envs)


def other_tasks() -> set[Any]:
    import asyncio

    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_have_one_env_per_row_in_torchrl_layout(backend: str) -> None:
    async def main() -> None:
        async with Collector(pool(4, episode_length=5), WeightProbe(1.0), frames_per_batch=32, total_frames=96) as c:
            rows: list[list[float]] = [[] for _ in range(4)]
            async for batch in c:
                assert batch.batch_size == (4, 8)
                assert batch.names == [None, "time"]
                assert (batch["action"] == 1).all()
                assert not batch["done"].any(), "a finished env is reset in the same step"
                for i in range(4):
                    rows[i] += batch["next", "observation"][i, :, 0].tolist()
                nxt, root = batch["next", "observation"][..., 0], batch["observation"][..., 0]
                same_traj = batch["collector", "traj_ids"][:, 1:] == batch["collector", "traj_ids"][:, :-1]
                assert torch.equal(same_traj, ~batch["next", "done"][:, :-1, 0])
                assert (root[:, 1:][same_traj] == nxt[:, :-1][same_traj]).all()
                assert (batch["next", "done"][..., 0] == (nxt == 5)).all()
            for row in rows:  # each env's steps, contiguous across batches
                assert row == [float(1 + t % 5) for t in range(24)]

    anyio.run(main, backend=backend)


def test_a_slow_env_never_holds_the_fast_ones_back() -> None:
    slow_env = AsyncCountingEnv(step_time=0.5)
    fast = [AsyncCountingEnv(step_time=0.001) for _ in range(3)]
    envs = iter([slow_env, *fast])

    async def main() -> None:
        async with Collector(lambda: AsyncEnvPool(lambda: next(envs), 4), None, frames_per_batch=16) as c:
            c.start(ReplayBuffer(1000))
            await anyio.sleep(0.4)
            # While the slow env takes its first step, the fast ones fill this batch's rows and the next's,
            # then wait (parked): bounded at two batches.
            assert slow_env.steps_taken == 0
            assert [env.steps_taken for env in fast] == [8, 8, 8]

    anyio.run(main)


def test_every_frame_carries_the_version_that_chose_its_action() -> None:
    async def main() -> None:
        async with Collector(pool(2, step_time=0.002), WeightProbe(0.0), frames_per_batch=40) as c:
            await anext(c)
            await c.update_policy_weights_(WeightProbe(1.0))
            for _ in range(3):
                batch = await anext(c)
                version = batch["collector", "policy_version"]
                assert (batch["action"] == version).all()
                assert (version.diff(dim=-1) >= 0).all()
            assert (version == 1).all()

    anyio.run(main)


def test_seed_truncation_and_state() -> None:
    made: list[AsyncCountingEnv] = []

    def make() -> AsyncCountingEnv:
        made.append(AsyncCountingEnv(episode_length=100))
        return made[-1]

    async def main() -> None:
        async with Collector(lambda: AsyncEnvPool(make, 3), None, frames_per_batch=30, max_frames_per_traj=4) as c:
            assert c.set_seed(7) == 10  # the next free seed: 3 envs take 7, 8 and 9
            batch = await anext(c)
            assert [env.resets[1] for env in made] == [7, 8, 9]  # env i seeded with seed + i (after the first reset)
            truncated = batch["next", "truncated"][..., 0]
            assert truncated[:, 3::4].all()
            assert truncated.sum() == 6
            assert batch["next", "observation"][0, :, 0].tolist() == [1, 2, 3, 4] * 2 + [1, 2]
            assert set(c.state_dict()) >= {"frames", "next_traj_counter", "policy_version"}

    anyio.run(main)


def test_pause_stops_stepping_and_background_fills_the_buffer() -> None:
    made: list[AsyncCountingEnv] = []

    def make() -> AsyncCountingEnv:
        made.append(AsyncCountingEnv(step_time=0.002))
        return made[-1]

    async def main() -> None:
        rb = ReplayBuffer(100_000)
        async with Collector(lambda: AsyncEnvPool(make, 4), None, frames_per_batch=400) as c:
            c.start(replay_buffer=rb)
            await wait_until(lambda: len(rb) >= 400, timeout=20)
            async with c.pause():
                steps = sum(env.steps_taken for env in made)
                await anyio.sleep(0.2)
                assert sum(env.steps_taken for env in made) == steps
            await wait_until(lambda: sum(env.steps_taken for env in made) > steps, timeout=10)

    anyio.run(main)


# -- bad input -------------------------------------------------------------------------------------------
class BlockingReset(AsyncEnv):
    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:  # type: ignore[override]
        return np.zeros(1, np.float32), {}

    async def step(self, action: Any) -> Any:
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_envs_that_are_not_coroutine_envs_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"BlockingReset\.reset is not a coroutine function"):
        AsyncEnvPool(BlockingReset, 2)
    with pytest.raises(ConfigurationError, match=r"make_env=.*built CartPoleEnv\(\.\.\.\): expected an acollect"):
        AsyncEnvPool(lambda: gym.make("CartPole-v1").unwrapped, 2)
    with pytest.raises(ConfigurationError, match="num_envs"):
        AsyncEnvPool(AsyncCountingEnv, 0)
    with pytest.raises(ConfigurationError, match=r"returned a coroutine env \(AsyncCountingEnv\): wrap it in a pool"):
        make_env(AsyncCountingEnv)
    with pytest.raises(ConfigurationError, match="step_timeout"):
        AsyncEnvPool(AsyncCountingEnv, 2, step_timeout=-1)


class FailsToClose(AsyncCountingEnv):
    async def aclose(self) -> None:
        raise OSError("connection already gone")


def factory_failing_at(call: int, made: list[AsyncCountingEnv]) -> Any:
    """An env factory that raises on its ``call``-th call (from 1) and keeps every env it built in ``made``."""

    def make() -> AsyncCountingEnv:
        if len(made) + 1 == call:
            raise RuntimeError("the simulator refused a session")
        made.append(FailsToClose() if not made else AsyncCountingEnv())  # the first one's aclose() raises
        return made[-1]

    return make


@pytest.mark.parametrize("where", ["plain code", "on an event loop", "on a trio loop"])
def test_a_failing_make_env_names_the_env_and_closes_those_already_built(where: str) -> None:
    made: list[AsyncCountingEnv] = []

    def build() -> None:
        with pytest.raises(EnvError, match=r"^env 2: make_env='.*make' raised RuntimeError: the simulator") as info:
            AsyncEnvPool(factory_failing_at(3, made), 4)
        assert isinstance(info.value.__cause__, RuntimeError)

    if where == "plain code":
        build()
    else:

        async def main() -> None:
            build()
            await anyio.sleep(0.001)  # the loop goes on, intact

        anyio.run(main, backend="trio" if where == "on a trio loop" else "asyncio")
    assert len(made) == 2
    assert made[1].closed, "env 1 was closed although env 0's aclose() raised"


def test_a_pool_dropped_unclosed_during_a_trio_run_leaves_the_run_intact(caplog: pytest.LogCaptureFixture) -> None:
    # A pool's finalizer (or close()) may run while a trio loop runs in the thread: a collector's batch waits, the
    # garbage collector drops an old pool. A loop of its own run there would put anyio on trio's backend inside it
    # and corrupt the trio run (TrioInternalError, "Nursery stack corrupted"); the pool says so and runs none.
    import gc

    used = AsyncEnvPool(AsyncCountingEnv, 2)
    used.reset(seed=0)  # the blocking API, in plain code: its private loop, closed on a thread of its own below

    async def scenario() -> None:
        doomed = AsyncEnvPool(AsyncCountingEnv, 2)
        async with Collector(functools.partial(AsyncEnvPool, AsyncCountingEnv, 2), None, frames_per_batch=8) as c:
            await anext(c)
            del doomed
            gc.collect()
            used.close()
            assert all(e.closed for e in used.envs)  # type: ignore[attr-defined]
            with pytest.raises(EnvError, match="blocking methods were called on a running event loop"):
                AsyncEnvPool(AsyncCountingEnv, 1).reset()
            for _ in range(3):
                assert (await anext(c)).numel() == 8

    with caplog.at_level("WARNING", logger="acollect"):
        anyio.run(scenario, backend="trio")
    assert "AsyncEnvPool.close() on a running loop" in caplog.text


def test_a_refused_env_closes_those_already_built() -> None:
    made = [AsyncCountingEnv(), AsyncCountingEnv()]
    envs = iter([*made, object()])
    with pytest.raises(ConfigurationError, match=r"built object\(\.\.\.\)"):
        AsyncEnvPool(lambda: next(envs), 3)
    assert [env.closed for env in made] == [True, True]


class Returns(AsyncCountingEnv):
    """Env 1 of the pool returns ``bad`` from its second step."""

    def __init__(self, bad: Any) -> None:
        super().__init__()
        self.bad = bad

    async def step(self, action: Any) -> Any:
        result = await super().step(action)
        return self.bad if self.steps_taken == 2 and self.bad is not None else result


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ((np.zeros(1, np.float32), 1.0, False, False), "a result"),
        ([np.zeros(1, np.float32), 1.0, False, False, {}], "a result"),
        ((np.zeros(2, np.float32), 1.0, False, False, {}), "observation"),
        ((np.zeros((1, 1), np.float32), 1.0, False, False, {}), "observation"),
        ((np.array(["x"]), 1.0, False, False, {}), "observation"),
        ((np.zeros(1, np.float32), "1.0", False, False, {}), "reward"),
        ((np.zeros(1, np.float32), 1.0, None, False, {}), "terminated"),
        ((np.zeros(1, np.float32), 1.0, False, 1, {}), "truncated"),
    ],
)
def test_a_malformed_step_names_the_env_and_the_field(bad: Any, field: str) -> None:
    envs = iter([Returns(None), Returns(bad), Returns(None)])

    async def main() -> None:
        collector = Collector(lambda: AsyncEnvPool(lambda: next(envs), 3), None, frames_per_batch=30)
        with pytest.raises(EnvError, match=rf"env 1 \(Returns\)\.step returned {field}"):
            await anext(collector)
        assert collector.state is CollectorState.BROKEN
        await collector.async_shutdown()

    anyio.run(main)


class Hangs(AsyncCountingEnv):
    """Records whether its step was cancelled, and whether its aclose() ran (or hangs in it)."""

    def __init__(self, *, hang_in_aclose: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cancelled = False
        self.hang_in_aclose = hang_in_aclose

    async def step(self, action: Any) -> Any:
        try:
            return await super().step(action)
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise

    async def aclose(self) -> None:
        if self.hang_in_aclose:
            await anyio.sleep(3600)
        await super().aclose()


def test_a_raising_step_breaks_the_collector_cancels_the_others_and_closes_every_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(async_pool_module, "ACLOSE_TIMEOUT", 0.3)
    crashing = Hangs(crash_at_step=2, step_time=0.01)
    sleepers = [Hangs(step_time=3600.0), Hangs(step_time=3600.0, hang_in_aclose=True)]
    envs = iter([*sleepers, crashing])

    async def main() -> None:
        collector = Collector(lambda: AsyncEnvPool(lambda: next(envs), 3), None, frames_per_batch=30)
        start = time.monotonic()
        expected = r"env 2 \(Hangs\)\.step raised RuntimeError: AsyncCountingEnv crashed"
        with pytest.raises(EnvError, match=expected) as info:
            await anext(collector)
        assert time.monotonic() - start < 20, "the collector broke at once, not when the other envs' steps ended"
        assert isinstance(info.value.__cause__, RuntimeError)
        assert collector.state is CollectorState.BROKEN
        assert all(env.cancelled for env in sleepers), "the other envs' steps were cancelled"
        start = time.monotonic()
        await collector.async_shutdown()
        assert time.monotonic() - start < 20, "an env's aclose() that hangs is abandoned at its deadline"
        assert crashing.closed  # every env's aclose() was awaited
        assert sleepers[0].closed
        assert not other_tasks(), "no task is left"

    anyio.run(main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_over_step_timeout_names_the_env(backend: str) -> None:
    envs = iter([AsyncCountingEnv(), AsyncCountingEnv(step_time=lambda: 3600.0)])

    async def main() -> None:
        collector = Collector(lambda: AsyncEnvPool(lambda: next(envs), 2, step_timeout=0.3), None, frames_per_batch=40)
        start = time.monotonic()
        with pytest.raises(EnvError, match=r"env 1 \(AsyncCountingEnv\)\.step took longer than step_timeout=0.3s"):
            await anext(collector)
        assert time.monotonic() - start < 20  # at step_timeout, not when the step ends (an hour)
        await collector.async_shutdown()

    anyio.run(main, backend=backend)


def test_a_cancelled_batch_loses_nothing_and_shutdown_leaves_no_task() -> None:
    made: list[AsyncCountingEnv] = []

    def make() -> AsyncCountingEnv:
        made.append(AsyncCountingEnv(episode_length=1000, step_time=0.01))
        return made[-1]

    async def main() -> None:
        collector = Collector(lambda: AsyncEnvPool(make, 2), None, frames_per_batch=40)
        with anyio.move_on_after(0.1) as scope:
            await anext(collector)
        assert scope.cancelled_caught
        # The envs fill this batch and their rows of the next, then wait: nothing runs on for ever.
        await wait_until(lambda: all(env.steps_taken == 40 for env in made), timeout=10)
        await anyio.sleep(0.1)
        assert all(env.steps_taken == 40 for env in made)
        batch = await anext(collector)  # the batch the cancelled call waited for, whole
        assert batch["next", "observation"][0, :, 0].tolist() == [float(t) for t in range(1, 21)]
        await collector.async_shutdown()
        assert not other_tasks()

    anyio.run(main)


def test_reset_at_each_iter_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(ConfigurationError, match="reset_at_each_iter"):
            async with Collector(pool(2), None, frames_per_batch=8, reset_at_each_iter=True):
                pass

    anyio.run(main)


def test_a_big_policy_runs_in_a_thread_and_a_small_one_inline() -> None:
    class Noting(torch.nn.Module):
        """Takes ``seconds`` per pass, and notes the thread each pass ran in."""

        def __init__(self, seconds: float) -> None:
            super().__init__()
            self.seconds = seconds
            self.threads: list[str] = []

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            self.threads.append(threading.current_thread().name)
            time.sleep(self.seconds)
            return torch.zeros(observation.shape[0], dtype=torch.int64)

    async def main() -> None:
        loop_thread = threading.current_thread().name
        for seconds, runs_in in ((0.005, "acollect-async-env-policy"), (0.0, loop_thread)):
            policy = Noting(seconds)
            async with Collector(pool(2), policy, frames_per_batch=8) as c:
                batch = await anext(c)
                assert batch.numel() == 8
            # The first passes time the policy (on the loop); the batch's passes ran where the timing sent them.
            assert policy.threads[-1] == runs_in, policy.threads

    anyio.run(main)


def test_the_blocking_api_steps_the_pool_in_lockstep() -> None:
    env = AsyncEnvPool(AsyncCountingEnv, 2)
    root = env.reset(seed=3)
    out = env.step(root.set("action", torch.ones(2, dtype=torch.int64)))
    assert out["observation"][:, 0].tolist() == [1.0, 1.0]
    assert [e.resets for e in env.envs] == [[3], [4]]  # type: ignore[attr-defined]
    env.close()
    assert all(e.closed for e in env.envs)  # type: ignore[attr-defined]


def test_worker_collectors_run_each_pool_on_the_workers_own_loop() -> None:
    # Env 0 of each pool takes 40 ms a step, the others 1 ms: in lockstep a batch of 8 steps per env would
    # take 8 x 40 ms; with each env a task, the fast envs' rows fill meanwhile and run ahead.
    slow_first = functools.partial(AsyncEnvPool, SlowFirst, 4)

    async def main() -> None:
        async with MultiSyncCollector([slow_first] * 2, WeightProbe(1.0), frames_per_batch=64,
                                      total_frames=192) as c:  # fmt: skip
            batches = [batch async for batch in c]
        for batch in batches:
            assert batch.batch_size == (2, 4, 8)
            assert (batch["action"] == 1).all()
            obs = batch["next", "observation"][..., 0]
            assert (obs[..., 1:] - obs[..., :-1] == 1).all(), "each row: one env's consecutive steps"
        ids = torch.stack([b["collector", "traj_ids"] for b in batches])
        assert set(ids[:, 0].unique().tolist()).isdisjoint(ids[:, 1].unique().tolist()), "ids unique across workers"

    anyio.run(main)


class SlowFirst(AsyncCountingEnv):
    made = 0

    def __init__(self) -> None:
        SlowFirst.made += 1
        super().__init__(episode_length=1000, step_time=0.04 if SlowFirst.made % 4 == 1 else 0.001)


def test_a_restored_state_continues_counters_and_trajectory_ids() -> None:
    async def main() -> None:
        async with Collector(pool(2, episode_length=3), WeightProbe(0.0), frames_per_batch=8) as c:
            await anext(c)
            await c.update_policy_weights_(WeightProbe(1.0))
            state = c.state_dict()
        async with Collector(pool(2, episode_length=3), WeightProbe(0.0), frames_per_batch=8) as resumed:
            resumed.load_state_dict(state)
            batch = await anext(resumed)
            assert resumed.frames == 16
            assert batch["collector", "traj_ids"].min() >= state["next_traj_counter"]
            assert (batch["action"] == 1).all(), "the restored weights chose the actions"
            assert (batch["collector", "policy_version"] == 1).all()

    anyio.run(main)


class DictEnv(AsyncEnv):
    """Dict observations (keys out of alphabetical order) and MultiDiscrete actions."""

    observation_space = gym.spaces.Dict({"z": gym.spaces.Box(-1e6, 1e6, (2,), np.float64), "a": gym.spaces.Discrete(5)})
    action_space = gym.spaces.MultiDiscrete([3, 4])

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.n = 0
        return {"z": np.zeros(2), "a": 0}, {}

    async def step(self, action: Any) -> Any:
        assert isinstance(action, np.ndarray)
        assert action.shape == (2,)
        self.n += 1
        return {"z": np.full(2, float(self.n)), "a": self.n % 5}, 0.5, False, False, {}


def test_dict_observations_and_array_actions() -> None:
    async def main() -> None:
        async with Collector(lambda: AsyncEnvPool(DictEnv, 2), None, frames_per_batch=8) as c:
            batch = await anext(c)
            assert batch["next", "z"].dtype == torch.float64
            assert batch["next", "z"][0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
            assert batch["next", "a"][0].tolist() == [1, 2, 3, 4]
            assert batch["action"].shape == (2, 4, 2)

    anyio.run(main)


def test_a_coroutine_env_failing_in_a_worker_is_reported_with_its_index() -> None:
    crashing = functools.partial(AsyncEnvPool, functools.partial(AsyncCountingEnv, crash_at_step=3), 2)

    async def main() -> None:
        collector = MultiSyncCollector([crashing] * 2, None, frames_per_batch=64)
        with anyio.fail_after(60), pytest.raises(RemoteError, match=r"env \d \(AsyncCountingEnv\)\.step raised"):
            async for _ in collector:
                pass
        assert collector.state is CollectorState.BROKEN
        await collector.async_shutdown()

    anyio.run(main)
