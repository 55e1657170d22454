"""Continuous control out of the box: float64 observations meet float32 policies, and actions that leave their Box.

MuJoCo envs give float64 observations; a torch policy's parameters are float32. ``GymEnv`` stores float64 ``Box``
observations as float32 by default (``double_to_float``), through every collector (the workers' shared memory is
laid out from the env's specs). A dtype mismatch that still reaches a policy (``double_to_float=False``, an env of
one's own) is a ``PolicyError`` naming the key, both dtypes and the fix, not torch's ``mat1 and mat2``. A Gaussian
policy's actions that leave their ``Box`` are stored as written and said once (``ActionSpaceWarning``).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import TransformObservation
from torch import nn

from acollect import AsyncBatchedCollector, Collector, GymEnv, MultiSyncCollector, PolicyError, RemoteError
from acollect._warnings import ActionSpaceWarning
from acollect.envs._gym_step import ActionBounds
from acollect.specs import Bounded
from acollect.testing import CountingEnv, CountingGymEnv, assert_counting_batch

COLLECTORS: dict[str, Callable[..., Any]] = {
    "Collector": lambda env, policy, **kw: Collector(env, policy, **kw),
    "MultiSyncCollector": lambda env, policy, **kw: MultiSyncCollector([env] * 2, policy, **kw),
    # The server in a thread: a server process starts as a spawned worker does, seconds that say nothing more here.
    "AsyncBatchedCollector": lambda env, policy, **kw: AsyncBatchedCollector([env] * 2, policy, server="thread", **kw),
}


class LinearIndex(nn.Module):
    """A float32 ``nn.Linear`` choosing one of two actions: it fails on a float64 observation, as any torch layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


class CastsItself(LinearIndex):
    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return super().forward(observation.float())


class FixedActions(nn.Module):
    """Writes the same actions at every step (``[n_envs, *shape]``), whatever the observation."""

    def __init__(self, actions: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("actions", actions)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.actions.clone()


def counting64_envs(**kwargs: Any) -> Callable[[], GymEnv]:
    """A factory of 2 gymnasium counting sub-envs whose observations are float64, as a MuJoCo env's are.

    Nested functions, so that a worker gets them by value and never imports this module (with torch, seconds).
    """

    def make() -> GymEnv:
        def counting64(start: int) -> gym.Env[Any, Any]:
            box = gym.spaces.Box(-1e9, 1e9, (1,), dtype=np.float64)
            return TransformObservation(CountingGymEnv(5, start=start), lambda obs: obs.astype(np.float64), box)

        fns = [functools.partial(counting64, i * 1_000_000) for i in range(2)]
        return GymEnv(gym.vector.SyncVectorEnv(fns), **kwargs)

    return make


async def _collect_all(collector: Any) -> None:
    async with collector:
        async for _ in collector:
            pass


def _raised(exc: BaseException) -> str:
    """The message of a policy error, raised here or in a worker (a RemoteError naming its type)."""
    if isinstance(exc, RemoteError):
        assert exc.type_name.rsplit(".", 1)[-1] == "PolicyError", exc.type_name
    else:
        assert isinstance(exc, PolicyError), type(exc)
    return str(exc)


# -- float64 observations ------------------------------------------------------------------------------------


def test_a_float64_box_gets_a_float32_spec_unless_asked_to_keep_it() -> None:
    with counting64_envs()() as env:
        assert env.observation_spec["observation"].dtype == torch.float32
        root = env.reset()
        assert root["observation"].dtype == torch.float32
        assert root["observation"].squeeze(-1).tolist() == [0.0, 1_000_000.0]
    with counting64_envs(double_to_float=False)() as env:
        assert env.observation_spec["observation"].dtype == torch.float64
        assert env.reset()["observation"].dtype == torch.float64
    with GymEnv("CartPole-v1") as cartpole:  # float32 Boxes are left as they are
        assert cartpole.observation_spec["observation"].dtype == torch.float32


def test_double_to_float_is_checked() -> None:
    with pytest.raises(ValueError, match=r"double_to_float.*True or False"):
        counting64_envs(double_to_float="yes")()


@pytest.mark.parametrize("kind", sorted(COLLECTORS))
async def test_float64_gym_observations_reach_a_float32_policy_as_float32(kind: str) -> None:
    policy = LinearIndex()
    async with COLLECTORS[kind](counting64_envs(), policy, frames_per_batch=32, total_frames=64) as collector:
        batches = [batch.clone() async for batch in collector]
    assert len(batches) == 2
    for batch in batches:
        assert batch["observation"].dtype == torch.float32
        assert batch["next", "observation"].dtype == torch.float32
        assert_counting_batch(batch)  # the values came through the cast intact
        # The policy ran on those observations (not on zeros, nor on a second copy).
        with torch.no_grad():
            assert torch.equal(batch["action"], policy(batch["observation"]))


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
async def test_float64_kept_on_request_reaches_a_float64_policy(kind: str) -> None:
    env = counting64_envs(double_to_float=False)
    async with COLLECTORS[kind](env, LinearIndex().double(), frames_per_batch=32, total_frames=32) as collector:
        async for batch in collector:
            assert batch["observation"].dtype == torch.float64
            assert_counting_batch(batch)


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
async def test_float64_kept_meeting_a_float32_policy_names_key_dtypes_and_fix(kind: str) -> None:
    env = counting64_envs(double_to_float=False)
    with pytest.raises((PolicyError, RemoteError)) as raised:
        await _collect_all(COLLECTORS[kind](env, LinearIndex(), frames_per_batch=32, total_frames=32))
    message = _raised(raised.value)
    assert "cannot read 'observation' of dtype torch.float64: its parameters are torch.float32" in message
    assert "double_to_float=True" in message
    assert "observation.float()" in message
    assert "mat1 and mat2" in message  # torch's own words are kept, after ours


@pytest.mark.parametrize("kind", sorted(COLLECTORS))
async def test_a_float64_env_of_ones_own_gets_the_named_error(kind: str) -> None:
    env = functools.partial(CountingEnv, num_envs=2, dtype=torch.float64)
    with pytest.raises((PolicyError, RemoteError)) as raised:
        await _collect_all(COLLECTORS[kind](env, LinearIndex(), frames_per_batch=32, total_frames=32))
    message = _raised(raised.value)
    assert "'observation' of dtype torch.float64: its parameters are torch.float32" in message
    assert "declares float32 in its observation_spec" in message


async def test_a_float32_env_meeting_a_float64_policy_names_the_other_fix() -> None:
    with pytest.raises(PolicyError, match=r"'observation' of dtype torch.float32: its parameters are torch.float64"):
        await _collect_all(Collector(CountingEnv, LinearIndex().double(), frames_per_batch=8, total_frames=8))


async def test_a_policy_that_casts_its_input_is_not_refused() -> None:
    env = functools.partial(CountingEnv, num_envs=2, dtype=torch.float64)
    async with Collector(env, CastsItself(), frames_per_batch=8, total_frames=8) as collector:
        async for batch in collector:
            assert batch["observation"].dtype == torch.float64


class Fails(nn.Module):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.linear, self.message = nn.Linear(1, 2), message

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(self.message)


@pytest.mark.parametrize(
    ("dtype", "message"),
    [
        (torch.float64, "CUDA out of memory"),  # a float64 input, but no dtype in torch's words
        (torch.float32, "expected scalar type Float"),  # dtype words, but the dtypes agree
    ],
)
async def test_other_errors_of_the_policy_pass_through_unchanged(dtype: torch.dtype, message: str) -> None:
    env = functools.partial(CountingEnv, dtype=dtype)
    with pytest.raises(RuntimeError, match=message) as raised:
        await _collect_all(Collector(env, Fails(message), frames_per_batch=8, total_frames=8))
    assert not isinstance(raised.value, PolicyError)


# -- continuous actions outside their Box ----------------------------------------------------------------------

# Pendulum-v1 takes a torque in [-2, 2]: two of these four are outside.
OUTSIDE = torch.tensor([[3.0], [0.5], [-2.5], [1.0]])


async def test_actions_outside_the_box_warn_once_naming_counts_and_bounds_and_are_stored_as_written() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with Collector(
            functools.partial(GymEnv, "Pendulum-v1", num_envs=4), FixedActions(OUTSIDE),
            frames_per_batch=64, total_frames=192,
        ) as collector:  # fmt: skip
            batches = [batch.clone() async for batch in collector]
    said = [w for w in caught if issubclass(w.category, ActionSpaceWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert [w for w in caught if w not in said] == []
    message = str(said[0].message)
    assert "2 of 4 action entries of one step (4 sub-envs) were outside [-2, 2] (from -2.5 to 3)" in message
    assert "stored as the policy wrote them" in message
    assert said[0].filename == __file__  # the user's line, not acollect's
    assert len(batches) == 3
    for batch in batches:
        assert torch.equal(batch["action"], OUTSIDE[:, None].expand(4, 16, 1))  # not clipped


async def test_actions_outside_the_box_are_stored_as_written_by_workers_too() -> None:
    async with MultiSyncCollector(
        [functools.partial(GymEnv, "Pendulum-v1", num_envs=4)] * 2, FixedActions(OUTSIDE),
        frames_per_batch=128, total_frames=128,
    ) as collector:  # fmt: skip
        async for batch in collector:
            assert torch.equal(batch["action"], OUTSIDE[None, :, None].expand(2, 4, 16, 1))


async def test_actions_within_the_box_say_nothing() -> None:
    inside = torch.tensor([[2.0], [-2.0], [0.0], [1.5]])  # the bounds themselves are inside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with Collector(
            functools.partial(GymEnv, "Pendulum-v1", num_envs=4), FixedActions(inside),
            frames_per_batch=64, total_frames=64,
        ) as collector:  # fmt: skip
            async for batch in collector:
                assert torch.equal(batch["action"], inside[:, None].expand(4, 16, 1))


def test_the_check_counts_nan_and_names_bounds_per_entry() -> None:
    spec = Bounded(torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 2.0]))
    bounds = ActionBounds.of(spec, (2, 2))
    assert bounds is not None
    assert bounds.holds(np.array([[1.0, 0.0], [-1.0, 2.0]], dtype=np.float32))
    bad = np.array([[np.nan, 1.0], [0.0, 2.5]], dtype=np.float32)
    assert not bounds.holds(bad)
    message = bounds.message(bad)
    assert "2 of 4 action entries of one step (2 sub-envs) were outside low=[-1.0, 0.0], high=[1.0, 2.0]" in message
    assert "and NaN" in message


@pytest.mark.parametrize(
    "spec",
    [
        Bounded(-np.inf, np.inf, shape=(2,)),  # nothing to leave
        Bounded(0, 3, shape=(), dtype=torch.int64),  # an integer Box: gymnasium's own check applies
    ],
)
def test_no_check_where_there_is_nothing_to_check(spec: Bounded) -> None:
    assert ActionBounds.of(spec, (2, *spec.shape)) is None


# -- MuJoCo (the mujoco extra) ---------------------------------------------------------------------------------

needs_mujoco = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the mujoco extra")


class Gaussian(nn.Module):
    """A float32 Gaussian policy on HalfCheetah's 17 observations: its samples leave [-1, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Linear(17, 6)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Normal(self.mean(observation), 1.0).sample()


@needs_mujoco
@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
async def test_halfcheetah_with_a_float32_gaussian_policy(
    kind: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo 4 writes its deprecation warnings to MUJOCO_LOG.TXT in the working dir
    env = functools.partial(GymEnv, "HalfCheetah-v5", num_envs=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with COLLECTORS[kind](env, Gaussian(), frames_per_batch=64, total_frames=64) as collector:
            async for batch in collector:
                assert batch["observation"].dtype == torch.float32
                assert batch["observation"].shape[-1] == 17
                assert (batch["action"].abs() > 1).any()  # stored as sampled
    said = [w for w in caught if issubclass(w.category, ActionSpaceWarning)]
    # In-process the warning reaches the caller; a worker ignores warnings (filter_worker_warnings).
    assert len(said) == (1 if kind == "Collector" else 0)
