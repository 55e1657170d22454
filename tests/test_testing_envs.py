"""acollect.testing: the counting, crashing, slow and gated envs, the gymnasium counting env, the stream checker and the
weight probe's range."""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from acollect.errors import ConfigurationError, EnvError, PolicyError
from acollect.specs import Categorical
from acollect.testing import (
    ENV_STRIDE,
    RESET_JUMP,
    CountingEnv,
    CountingGymEnv,
    CrashingEnv,
    Gate,
    SlowEnv,
    WeightProbe,
    assert_counting_batch,
)


def collect(env: CountingEnv, steps: int) -> TensorDict:
    root, nxt = env.make_root(), env.make_next()
    env.reset_into(root)
    rows = []
    for _ in range(steps):
        before = root.clone()
        action = env.action_spec.rand(env.batch_size)
        env.step_and_reset_into(action, nxt, root)
        rows.append(before.set("action", action).set("next", nxt.clone()))
    return torch.stack(rows, dim=1)


def test_counting_env_scheme() -> None:
    env = CountingEnv(num_envs=2, episode_length=[2, 3], start=5)
    assert env.action_spec == Categorical(2)
    assert env.observation_spec["observation"].dtype == torch.float32
    batch = collect(env, 6)
    obs = batch["observation"].squeeze(-1)
    nxt = batch["next", "observation"].squeeze(-1)
    j = RESET_JUMP
    assert obs[0].tolist() == [5, 6, 7 + j, 8 + j, 9 + 2 * j, 10 + 2 * j]
    assert nxt[1].tolist() == [ENV_STRIDE + 5 + k for k in (1, 2, 3)] + [ENV_STRIDE + 5 + j + k for k in (4, 5, 6)]
    assert batch["next", "terminated"].squeeze(-1).tolist() == [
        [False, True, False, True, False, True],
        [False, False, True, False, False, True],
    ]
    assert torch.equal(batch["next", "done"], batch["next", "terminated"])
    assert not batch["next", "truncated"].any()
    assert torch.equal(batch["next", "reward"], torch.ones(2, 6, 1))
    assert env.episode_id.tolist() == [3, 2]
    assert env.steps_taken.tolist() == [6, 6]
    assert env.step_count == 6
    assert env.last_action is not None
    assert env.last_action.shape == (2,)
    assert_counting_batch(batch)


def test_counting_env_mask_reset_and_dtype() -> None:
    env = CountingEnv(num_envs=3, episode_length=100, dtype=torch.float64)
    root = env.reset()
    assert root["observation"].dtype == torch.float64
    root["truncated"][:] = True
    env.reset_into(root, mask=torch.tensor([False, True, False]))
    assert root["observation"].squeeze(-1).tolist() == [0, ENV_STRIDE + RESET_JUMP, 2 * ENV_STRIDE]
    assert root["truncated"].squeeze(-1).tolist() == [True, False, True]
    assert env.episode_id.tolist() == [0, 1, 0]


def test_counting_env_rejects_bad_masks_and_actions() -> None:
    env = CountingEnv(num_envs=2)
    root, nxt = env.make_root(), env.make_next()
    with pytest.raises(ConfigurationError, match="mask"):
        env.reset_into(root, mask=torch.tensor([True, False, True]))
    env.reset_into(root)
    with pytest.raises(PolicyError, match=r"expected \(2, ...\)"):
        env.step_and_reset_into(torch.zeros(3, dtype=torch.int64), nxt, root)


def test_counting_env_convenience_api_and_close() -> None:
    with CountingEnv(num_envs=1, episode_length=1) as env:
        root = env.reset()
        out = env.step(root.set("action", torch.zeros(1, dtype=torch.int64)))
        assert out["observation"].item() == 1
        assert out["done"].item()
        assert env.last_root is not None
        assert env.last_root["observation"].item() == 1 + RESET_JUMP
    with pytest.raises(EnvError, match="closed"):
        env.reset()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs=0"),
        ({"num_envs": True}, "num_envs=True"),
        ({"episode_length": 0}, "episode_length=0"),
        ({"num_envs": 2, "episode_length": [3]}, r"episode_length=\[3\].*2 positive ints"),
    ],
)
def test_counting_env_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        CountingEnv(**kwargs)


def test_crashing_env_raises_at_its_nth_step_across_episodes() -> None:
    env = CrashingEnv(crash_at_step=5, num_envs=2, episode_length=2, exc_type=KeyError)
    root, nxt = env.make_root(), env.make_next()
    env.reset_into(root)
    for _ in range(4):
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), nxt, root)
    with pytest.raises(KeyError, match="step 5"):
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), nxt, root)
    assert nxt["observation"].squeeze(-1).tolist() == [4 + RESET_JUMP, ENV_STRIDE + 4 + RESET_JUMP]
    with pytest.raises(ConfigurationError, match="crash_at_step=0"):
        CrashingEnv(crash_at_step=0)


def test_slow_env_counts_like_counting_env_and_takes_its_time() -> None:
    env = SlowEnv(step_time=0.02, num_envs=2, episode_length=2)
    start = time.monotonic()
    batch = collect(env, 3)
    # A lower bound only: sleep never returns early, so this cannot flake.
    assert time.monotonic() - start >= 3 * 0.02
    assert_counting_batch(batch)
    with pytest.raises(ConfigurationError, match="step_time=-1"):
        SlowEnv(step_time=-1)


async def test_a_gated_env_holds_its_step_until_the_gate_opens_and_only_the_first_env_holds(tmp_path: Path) -> None:
    with Gate(tmp_path) as gate:
        first, second = gate.env(hold_at_step=2, num_envs=2)(), pickle.loads(pickle.dumps(gate.env(2)))()
        assert not gate.held
        stepped = threading.Event()

        def two_steps() -> None:
            collect(first, 2)
            stepped.set()

        thread = threading.Thread(target=two_steps)
        thread.start()
        await gate.wait_held()
        assert gate.holder == os.getpid()
        assert not stepped.is_set(), "the second step went on with the gate closed"
        assert_counting_batch(collect(second, 3))  # the gate is claimed already: another env passes it
        gate.open()
        thread.join(30)
        assert stepped.is_set()
    with Gate(tmp_path / "never") as gate:
        env = gate.env(hold_at_step=1, timeout=0.05)()
        with pytest.raises(TimeoutError, match=r"was not opened within 0\.05s"):
            collect(env, 1)
    with pytest.raises(ConfigurationError, match="hold_at_step=0"):
        gate.env(hold_at_step=0)()


def test_a_wide_probe_acts_its_weight_on_an_env_of_as_many_actions() -> None:
    env = CountingEnv(num_envs=3, n_actions=8)
    assert env.action_spec == Categorical(8)
    probe = WeightProbe(0.0, high=7)
    for version in range(8):
        probe.load_state_dict(WeightProbe(float(version)).state_dict())  # a push carries w only, not the range
        action = probe(env.reset()["observation"])
        assert action.tolist() == [version] * 3
        assert env.action_spec.is_in(action)
    assert WeightProbe(5.0)(torch.zeros(2, 1)).tolist() == [1, 1], "two actions by default"
    with pytest.raises(ConfigurationError, match="n_actions=0"):
        CountingEnv(n_actions=0)


def test_counting_gym_env_counts_and_pickles() -> None:
    # Not gymnasium's check_env: it wants a seeded reset to replay the episode, and the counter never restarts.
    env = CountingGymEnv(3, start=10)
    obs, info = env.reset(seed=0)
    assert obs in env.observation_space
    assert obs.tolist() == [10]
    assert info == {"episode_id": 0}
    assert env.step(env.action_space.sample())[0] in env.observation_space
    fns = pickle.loads(pickle.dumps(CountingGymEnv.env_fns(2, 4)))
    second = fns[1]()
    obs, _ = second.reset()
    assert obs.tolist() == [ENV_STRIDE]
    for _ in range(3):
        assert not second.step(0)[2]
    obs, reward, terminated, truncated, _ = second.step(1)
    assert obs.tolist() == [ENV_STRIDE + 4]
    assert reward == 1.0
    assert terminated
    assert not truncated
    assert second.reset()[0].tolist() == [ENV_STRIDE + 4 + RESET_JUMP]


def _tamper(batch: TensorDict, how: str) -> TensorDict:
    batch = batch.clone()
    obs, nxt = batch["observation"], batch["next", "observation"]
    if how == "dummy-transition":  # gymnasium NEXT_STEP's no-op step leaked: final -> reset
        t = int(batch["next", "done"][0, :, 0].nonzero()[0])
        obs[0, t + 1] = nxt[0, t]
        nxt[0, t + 1] = nxt[0, t] + RESET_JUMP
    elif how == "reset-as-final":  # the next observation of a done step is the reset one
        t = int(batch["next", "done"][0, :, 0].nonzero()[0])
        nxt[0, t] = obs[0, t + 1]
    elif how == "repeated-step":
        obs[1, 3], nxt[1, 3] = obs[1, 2], nxt[1, 2]
    elif how == "lost-step":
        obs[1, 3] += 1
        nxt[1, 3] += 1
    return batch


@pytest.mark.parametrize("how", ["dummy-transition", "reset-as-final", "repeated-step", "lost-step"])
def test_assert_counting_batch_catches_broken_streams(how: str) -> None:
    batch = collect(CountingEnv(num_envs=2, episode_length=3), 8)
    assert_counting_batch(batch)
    with pytest.raises(AssertionError):
        assert_counting_batch(_tamper(batch, how))


def test_assert_counting_batch_on_stacked_workers() -> None:
    workers = [collect(CountingEnv(num_envs=2, episode_length=[2, 5]), 7) for _ in range(3)]
    assert_counting_batch(torch.stack(workers))  # [workers, envs, time]
