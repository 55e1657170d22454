"""Where the time goes: ``stats().time_split``, ``worker_time_split`` and ``bottleneck`` on every collector class.

Each workload is made slow in one place only (the env, the policy, the inference server or the consumer), by a
sleep that frees the core, so the part it lands in dominates whatever else the machine is doing.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from acollect._time_split import PARTS
from acollect.stats import CollectorStats
from acollect.testing import CountingEnv, SlowEnv

START_METHOD = "forkserver"  # workers forked from one process that imported everything once: quick to start


class Sleepy(torch.nn.Module):
    """Acts 0 after sleeping ``seconds`` per call: a policy that costs time and frees the core meanwhile."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


def _policy(seconds: float = 0.0) -> TensorDictModule:
    return TensorDictModule(Sleepy(seconds), in_keys=["observation"], out_keys=["action"])


def _build(kind: type, env: Any, policy: Any, frames_per_batch: int, total_frames: int) -> Any:
    if kind is Collector:
        return Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames)
    kwargs: dict[str, Any] = {"frames_per_batch": frames_per_batch, "total_frames": total_frames,
                              "start_method": START_METHOD}  # fmt: skip
    if kind is AsyncBatchedCollector:
        policy = policy if policy is not None else _policy()
        kwargs["max_wait"] = 0.001
    return kind([env] * 2, policy, **kwargs)


async def _run(collector: Any, *, consumer_sleep: float = 0.0) -> CollectorStats:
    async with collector:
        with anyio.fail_after(120):
            async for _ in collector:
                if consumer_sleep:
                    await anyio.sleep(consumer_sleep)
            return collector.stats()  # type: ignore[no-any-return]


def _check_shape(stats: CollectorStats, workers: int) -> None:
    assert set(stats.time_split) == set(PARTS)
    assert sum(stats.time_split.values()) == pytest.approx(1.0)
    assert sorted(stats.worker_time_split) == list(range(workers))
    for split in stats.worker_time_split.values():
        assert sum(split.values()) == pytest.approx(1.0)


KINDS = [Collector, MultiSyncCollector, MultiAsyncCollector, AsyncBatchedCollector]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_slow_env_is_named_the_bottleneck(kind: type) -> None:
    env = functools.partial(SlowEnv, 0.004, num_envs=2)
    stats = await _run(_build(kind, env, None, frames_per_batch=16, total_frames=16 * 40))
    _check_shape(stats, 1 if kind is Collector else 2)
    assert stats.bottleneck == "env", stats.time_split
    assert stats.time_split["env"] > 0.5
    assert "bound by env stepping" in stats.describe()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_consumer_that_sleeps_between_batches_is_named_the_bottleneck(kind: type) -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    stats = await _run(_build(kind, env, None, frames_per_batch=16, total_frames=16 * 25), consumer_sleep=0.05)
    _check_shape(stats, 1 if kind is Collector else 2)
    assert stats.bottleneck == "trainer", stats.time_split
    assert stats.time_split["trainer"] > 0.5
    assert "bound by the trainer" in stats.describe()


@pytest.mark.parametrize("kind", [Collector, MultiAsyncCollector])
async def test_a_slow_policy_where_the_envs_run_is_named_the_bottleneck(kind: type) -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    stats = await _run(_build(kind, env, _policy(0.004), frames_per_batch=16, total_frames=16 * 40))
    assert stats.bottleneck == "policy", stats.time_split
    assert stats.time_split["policy"] > 0.5


async def test_a_sleeping_server_policy_is_named_the_bottleneck() -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    collector = _build(AsyncBatchedCollector, env, _policy(0.01), frames_per_batch=16, total_frames=16 * 20)
    stats = await _run(collector)
    _check_shape(stats, 2)
    assert stats.bottleneck == "inference", stats.time_split
    assert stats.time_split["actions"] > 0.5
    assert "bound by waiting for the inference server" in stats.describe()


async def test_no_bottleneck_is_named_before_anything_was_measured() -> None:
    collector = Collector(CountingEnv, frames_per_batch=8, total_frames=8)
    assert collector.stats().bottleneck is None
    assert collector.stats().time_split == dict.fromkeys(PARTS, 0.0)


async def test_the_server_says_where_its_own_time_goes() -> None:
    # A pass that sleeps 10 ms per call and fast envs: the server's loop spends its time in passes.
    env = functools.partial(CountingEnv, num_envs=2)
    collector = _build(AsyncBatchedCollector, env, _policy(0.01), frames_per_batch=16, total_frames=16 * 20)
    stats = await _run(collector)
    assert stats.inference is not None
    split = stats.inference["time_split"]
    assert set(split) == {"pass", "gathering", "idle"}
    assert sum(split.values()) == pytest.approx(1.0)
    assert split["pass"] > 0.5, split
