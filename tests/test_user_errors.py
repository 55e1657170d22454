"""Mistakes a new user makes, each answered by an error that names it: the argument, what was given, what was
expected and the fix (issue 34). Nothing here starts a worker process: every mistake is caught before one would
be needed, or on the in-process collector."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    CollectorBase,
    CollectorStateError,
    ConfigurationError,
    DistributedCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    PolicyError,
    RayCollector,
    ReplayBuffer,
)
from acollect.envs import GymEnv
from acollect.testing import CountingEnv, wait_until

FPB = 8


class FloatAction(torch.nn.Module):
    """A policy returning one float per env: probabilities, say, where CartPole takes an index."""

    def __init__(self, value: float | None = None) -> None:
        super().__init__()
        self.value = value

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.value is None:
            return torch.rand(obs.shape[0])
        return torch.full((obs.shape[0],), self.value)


class Builds(torch.nn.Module):
    """A policy class that builds with no argument."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[:1], dtype=torch.int64)


# Every collector class, built and never started (no process, no socket).
COLLECTORS: dict[str, Callable[..., CollectorBase]] = {
    "Collector": lambda policy=None: Collector(CountingEnv, policy, frames_per_batch=FPB),
    "MultiSyncCollector": lambda policy=None: MultiSyncCollector([CountingEnv] * 2, policy, frames_per_batch=FPB),
    "MultiAsyncCollector": lambda policy=None: MultiAsyncCollector([CountingEnv] * 2, policy, frames_per_batch=FPB),
    "AsyncCollector": lambda policy=None: AsyncCollector(CountingEnv, policy, frames_per_batch=FPB),
    "AsyncBatchedCollector": lambda policy=None: AsyncBatchedCollector(
        [CountingEnv] * 2, policy or Builds(), frames_per_batch=FPB
    ),
    "DistributedCollector": lambda policy=None: DistributedCollector([CountingEnv] * 2, policy, frames_per_batch=FPB),
    "RayCollector": lambda policy=None: RayCollector([CountingEnv] * 2, policy, frames_per_batch=FPB),
}


# -- float actions for a discrete action space ---------------------------------------------------------------
@pytest.mark.parametrize("num_envs", [None, 3], ids=["one env", "vector env"])
@pytest.mark.parametrize("value", [None, 1.0], ids=["probabilities", "an integral float"])
async def test_float_actions_for_a_discrete_space_name_the_dtype(num_envs: int | None, value: float | None) -> None:
    env = functools.partial(GymEnv, "CartPole-v1", **({} if num_envs is None else {"num_envs": num_envs}))
    async with Collector(env, FloatAction(value), frames_per_batch=FPB * (num_envs or 1)) as collector:
        with pytest.raises(PolicyError) as refused:
            await anext(collector)
    message = str(refused.value)
    assert "the policy wrote an 'action' of dtype torch.float32" in message, message
    assert "expected an integer dtype (torch.int64)" in message, message
    assert "Categorical" in message, message  # the action spec
    assert ".argmax(-1)" in message, message  # a fix
    assert "AssertionError from the env" in message, message  # what gymnasium said, kept


# -- a class as policy, an instance as policy_factory ---------------------------------------------------------
@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector", "AsyncBatchedCollector"])
def test_a_policy_class_is_refused_naming_both_fixes(kind: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        COLLECTORS[kind](torch.nn.Linear)
    message = str(refused.value)
    assert "policy=<class 'torch.nn.modules.linear.Linear'> is invalid" in message, message
    assert "a policy instance, not a class" in message, message
    # Linear needs arguments: the factory is a lambda.
    assert "policy=Linear(...)" in message, message
    assert "policy_factory=lambda: Linear(...)" in message, message

    with pytest.raises(ConfigurationError, match=r"policy_factory=Builds to build it where it runs"):
        COLLECTORS[kind](Builds)  # builds with no argument: the class itself is the factory


@pytest.mark.parametrize("make", [Collector, lambda env, **kw: MultiSyncCollector([env] * 2, **kw)])
def test_a_policy_instance_as_policy_factory_is_refused(make: Callable[..., CollectorBase]) -> None:
    with pytest.raises(ConfigurationError) as refused:
        make(CountingEnv, policy_factory=torch.nn.Linear(1, 2), frames_per_batch=FPB)
    message = str(refused.value)
    assert "policy_factory=Linear(...) (an nn.Module instance) is invalid" in message, message
    assert "zero-argument callable that returns the policy" in message, message
    assert "Pass the instance as policy=..." in message, message
    assert "policy_factory=lambda: Linear(...)" in message, message


def test_a_policy_factory_that_needs_arguments_is_refused_naming_them() -> None:
    def make_policy(hidden: int, *, depth: int, scale: float = 1.0) -> torch.nn.Module:
        return Builds()

    with pytest.raises(ConfigurationError) as refused:
        Collector(CountingEnv, policy_factory=make_policy, frames_per_batch=FPB)
    message = str(refused.value)
    assert "zero-argument callable" in message, message
    assert "requires hidden, depth" in message, message
    assert "scale" not in message.split("requires")[1], message  # it has a default
    assert "functools.partial" in message, message


@pytest.mark.parametrize(
    "factory",
    [Builds, lambda: torch.nn.Linear(1, 2), functools.partial(torch.nn.Linear, 1, 2), torch.nn.Identity],
    ids=["a class", "a lambda", "a partial", "a class taking *args"],
)
def test_zero_argument_factories_are_taken(factory: Callable[[], Any]) -> None:
    Collector(CountingEnv, policy_factory=factory, frames_per_batch=FPB)  # no error


# -- `for` instead of `async for` -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(COLLECTORS))
def test_a_plain_for_says_to_use_async_for(kind: str) -> None:
    collector = COLLECTORS[kind]()
    with pytest.raises(TypeError) as refused:
        for _ in collector:
            pass
    message = str(refused.value)
    assert f"a {kind} is iterated with `async for batch in collector`" in message, message
    assert "not `for`" in message, message
    assert "await anext(collector)" in message, message


# -- `await collector.start(rb)` ------------------------------------------------------------------------------
@pytest.mark.parametrize("awaited", [True, False], ids=["awaited", "called"])
async def test_start_works_awaited_or_not(awaited: bool) -> None:
    rb = ReplayBuffer(1_000)
    async with Collector(CountingEnv, frames_per_batch=FPB, total_frames=4 * FPB) as collector:
        started = collector.start(rb)
        assert collector.running_in_background  # the task runs once start() returns, awaited or not
        if awaited:
            assert await started is None  # at once: no NoneType error, no second start
        await wait_until(lambda: collector.exhausted, timeout=30)
        assert len(rb) == 4 * FPB
        with pytest.raises(CollectorStateError, match="already called"):
            await collector.start(rb)  # awaited, the second start is refused as it is when called


# -- a weight push with no weights to push --------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(set(COLLECTORS) - {"AsyncBatchedCollector"}))
async def test_a_weight_push_without_a_policy_says_so(kind: str) -> None:
    collector = COLLECTORS[kind]()  # built without a policy: random actions
    with pytest.raises(ConfigurationError) as refused:
        await collector.update_policy_weights_()
    message = str(refused.value)
    assert "policy_or_weights=None is invalid" in message, message
    assert "the collector was built without a policy holding weights: pass one" in message, message
    assert "NoneType" not in message, message


def test_an_inference_collector_needs_a_policy() -> None:
    # (AsyncBatchedCollector refuses to be built without one: its server runs the policy for every worker.)
    with pytest.raises(ConfigurationError, match=r"policy=None is invalid: expected a policy \(or a policy_factory\)"):
        AsyncBatchedCollector([CountingEnv] * 2, frames_per_batch=FPB)
