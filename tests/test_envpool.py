"""EnvPool as an env source: the adapter, its autoreset handling, and batches through the collectors.

Skipped where envpool is not installed (``pip install 'acollect[envpool]'``). Every transition of a
collected CartPole batch is checked against CartPole's own physics (gymnasium's ``CartPoleEnv``, started
from the batch's observation): EnvPool's no-op autoreset step (reward 0, final observation -> reset one)
fails that check, so a batch that held one would fail here.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from acollect import Collector, CollectorBase, MultiSyncCollector
from acollect.envs import EnvPoolEnv, GymEnv, is_envpool_env, make_env
from acollect.envs._envpool import shared_seeds_warning
from acollect.envs._factory import known_num_envs
from acollect.errors import ConfigurationError, EnvError
from acollect.testing import no_leaks

envpool = pytest.importorskip("envpool")

pytestmark = pytest.mark.envpool

N_ENVS = 8
# CartPole-v1 ends an episode when |x| > 2.4 or |theta| > 12 degrees; a fresh one starts within +-0.05.
X_LIMIT, THETA_LIMIT, RESET_RANGE = 2.4, 12 * 2 * math.pi / 360, 0.05


def make_cartpole(num_envs: int = N_ENVS, **kwargs: Any) -> Any:
    """An EnvPool CartPole; gymnasium's warning about the float64 bounds EnvPool builds its Box from is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
        env = envpool.make_gymnasium("CartPole-v1", num_envs=num_envs, **kwargs)
        env.observation_space  # noqa: B018  (EnvPool builds, and gymnasium warns about, its spaces on first use)
    return env


def assert_real_cartpole_transitions(batch: TensorDictBase) -> int:
    """Checks every transition of a ``[..., T]`` CartPole batch against CartPole's physics; returns the episode ends.

    For each step: the next observation is what CartPole computes from the observation and the action, the
    reward is 1, ``terminated`` says whether the next state is out of bounds, and the next step starts from the
    same state, or from a fresh one (within +-0.05) after an episode end.
    """
    batch = batch.reshape(-1, batch.shape[-1])
    obs, nxt = batch["observation"].double().numpy(), batch["next", "observation"].double().numpy()
    action = batch["action"].numpy()
    reward = batch["next", "reward"].squeeze(-1).numpy()
    terminated = batch["next", "terminated"].squeeze(-1).numpy()
    done = batch["next", "done"].squeeze(-1).numpy()
    physics: Any = gym.make("CartPole-v1").unwrapped
    physics.reset(seed=0)
    for e in range(obs.shape[0]):
        for t in range(obs.shape[1]):
            physics.state, physics.steps_beyond_terminated = obs[e, t].copy(), None  # as if freshly reset there
            expected, _, _, _, _ = physics.step(int(action[e, t]))
            np.testing.assert_allclose(nxt[e, t], expected, atol=1e-4, err_msg=f"env {e} step {t}: not a real step")
            assert reward[e, t] == 1.0, f"env {e} step {t}: reward {reward[e, t]} (EnvPool's no-op step gives 0)"
            out = abs(nxt[e, t, 0]) > X_LIMIT or abs(nxt[e, t, 2]) > THETA_LIMIT
            assert bool(terminated[e, t]) == out, f"env {e} step {t}: terminated={terminated[e, t]}"
            if t + 1 < obs.shape[1]:
                if done[e, t]:
                    assert np.abs(obs[e, t + 1]).max() <= RESET_RANGE, f"env {e} step {t + 1}: not a fresh episode"
                else:
                    np.testing.assert_array_equal(obs[e, t + 1], nxt[e, t], err_msg=f"env {e} step {t + 1}")
    physics.close()
    assert not batch["done"].any(), "root done flags are False: a finished sub-env is reset in the same step"
    torch.testing.assert_close(batch["next", "done"], batch["next", "terminated"] | batch["next", "truncated"])
    return int(done.sum())


def check_layout(batch: TensorDictBase, shape: tuple[int, ...]) -> None:
    assert batch.batch_size == shape
    assert batch["observation"].shape == (*shape, 4)
    assert batch["observation"].dtype == torch.float32
    assert batch["action"].dtype == torch.int64
    assert batch["next", "reward"].shape == (*shape, 1)
    for key in ("done", "terminated", "truncated"):
        assert batch["next", key].shape == (*shape, 1)
        assert batch["next", key].dtype == torch.bool
    assert batch["collector", "traj_ids"].shape == shape


# -- the adapter --------------------------------------------------------------------------------------------
def test_make_env_wraps_envpool_and_knows_its_size() -> None:
    raw = make_cartpole()
    assert is_envpool_env(raw)
    assert not is_envpool_env(type(raw))
    assert known_num_envs(raw, {}) == N_ENVS
    with make_env(raw) as env:
        assert isinstance(env, EnvPoolEnv)
        assert env.batch_size == (N_ENVS,)
        assert env.observation_spec["observation"].shape == (4,)
        assert env.action_spec.n == 2
        assert env.env is raw


def test_gym_env_points_envpool_to_its_adapter() -> None:
    raw = make_cartpole()
    with pytest.raises(ConfigurationError, match=r"EnvPoolEnv\(env\)"):
        GymEnv(raw)
    raw.close()


def test_steps_are_real_and_episode_ends_reset_at_once() -> None:
    with EnvPoolEnv(make_cartpole()) as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root)
        steps = []
        generator = torch.Generator().manual_seed(0)
        for _ in range(80):
            before, action = root.clone(), env.action_spec.rand(env.batch_size, generator)
            env.step_and_reset_into(action, nxt, root)
            steps.append(before.set("action", action).set("next", nxt.clone()))
    batch = torch.stack(steps, dim=1)
    assert assert_real_cartpole_transitions(batch) >= N_ENVS  # random CartPole episodes last ~20 steps


def steps_of(env: EnvPoolEnv, count: int, seed: int = 0) -> TensorDictBase:
    """``count`` steps of random actions from a reset, stacked ``[n_envs, count]`` as a batch holds them."""
    root, nxt = env.make_root(), env.make_next()
    env.reset_into(root)
    steps = []
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        before, action = root.clone(), env.action_spec.rand(env.batch_size, generator)
        env.step_and_reset_into(action, nxt, root)
        steps.append(before.set("action", action).set("next", nxt.clone()))
    return torch.stack(steps, dim=1)


def test_envpools_own_calls_step_as_its_public_api_does() -> None:
    # The adapter calls EnvPool's C++ bindings directly (its Python step and reset cost as much as the C++ step):
    # given the same seed and actions, the steps, resets and truncations must be those of the public API.
    # Episodes cut at 12 steps: random CartPole ends some of them before (terminated), the others are truncated.
    with EnvPoolEnv(make_cartpole(max_episode_steps=12, seed=3)) as env:
        assert env.uses_bindings, "envpool 0.9-1.2 has the bindings the adapter calls"
        direct = steps_of(env, 60)
    with EnvPoolEnv(make_cartpole(max_episode_steps=12, seed=3), bindings=False) as env:
        assert not env.uses_bindings
        public = steps_of(env, 60)
    assert public["next", "truncated"].any()
    assert public["next", "terminated"].any()
    torch.testing.assert_close(direct, public, rtol=0, atol=0)
    assert int(direct["next", "done"].sum()) >= N_ENVS * 5  # an episode ends at least every 12 steps


def test_masked_reset_resets_only_the_masked_sub_envs() -> None:
    with EnvPoolEnv(make_cartpole(4)) as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root)
        for _ in range(3):  # move every sub-env away from its start
            env.step_and_reset_into(torch.ones(4, dtype=torch.int64), nxt, root)
        before = root["observation"].clone()
        env.reset_into(root, mask=torch.tensor([False, True, False, True]))
        after = root["observation"]
        assert torch.equal(after[[0, 2]], before[[0, 2]])
        assert not torch.equal(after[[1, 3]], before[[1, 3]])
        assert after[[1, 3]].abs().max() <= RESET_RANGE
        # The reset cleared EnvPool's pending state: the next step of a reset sub-env is a real one.
        start, action = root.clone(), torch.zeros(4, dtype=torch.int64)
        env.step_and_reset_into(action, nxt, root)
        assert_real_cartpole_transitions(start.set("action", action).set("next", nxt.clone()).unsqueeze(1))


def test_one_hot_actions() -> None:
    with EnvPoolEnv(make_cartpole(2), categorical_action_encoding=False) as env:
        root = env.reset()
        action = torch.tensor([[0, 1], [1, 0]])
        assert env.action_spec.is_in(action)
        out = env.step(root.set("action", action))
        assert out["reward"].tolist() == [[1.0], [1.0]]


def test_seeding_after_build_is_refused() -> None:
    with EnvPoolEnv(make_cartpole(2, seed=3)) as env, pytest.raises(ConfigurationError, match="seed=3"):
        env.reset(seed=0)


def test_async_mode_is_refused() -> None:
    raw = make_cartpole(4, batch_size=2)
    with pytest.raises(ConfigurationError, match=r"batch_size'\]=2 is invalid"):
        EnvPoolEnv(raw)
    raw.close()


def test_other_api_flavours_are_refused() -> None:
    raw = envpool.make_dm("CartPole-v1", num_envs=2)
    assert is_envpool_env(raw)
    with pytest.raises(ConfigurationError, match="make_gymnasium"):
        make_env(raw)
    raw.close()


def test_closed_env_refuses_steps() -> None:
    env = EnvPoolEnv(make_cartpole(2))
    root = env.reset()
    env.close()
    env.close()
    with pytest.raises(EnvError, match="closed"):
        env.step(root.set("action", torch.zeros(2, dtype=torch.int64)))


# -- through the collectors ------------------------------------------------------------------------------
async def test_collector_batches_hold_only_real_transitions() -> None:
    with no_leaks():
        async with Collector(make_cartpole, None, frames_per_batch=N_ENVS * 64, total_frames=N_ENVS * 64 * 3) as c:
            batches = [batch async for batch in c]
    assert len(batches) == 3
    for batch in batches:
        check_layout(batch, (N_ENVS, 64))
    # Across batches too: each one starts where the last one stopped.
    whole = torch.cat(batches, dim=1)
    assert assert_real_cartpole_transitions(whole) >= N_ENVS
    ids, done = whole["collector", "traj_ids"], whole["next", "done"].squeeze(-1)
    assert torch.equal(ids[:, 1:] != ids[:, :-1], done[:, :-1]), "a new trajectory id exactly after each episode end"


async def test_multi_sync_collector_batches_hold_only_real_transitions() -> None:
    with no_leaks():
        async with MultiSyncCollector(
            # A seed of its own for each worker: with EnvPool's default (42) for both, they would step the same
            # episodes (and the collector warns).
            [functools.partial(envpool.make_gymnasium, "CartPole-v1", num_envs=4, seed=4 * i) for i in range(2)],
            None,
            frames_per_batch=2 * 4 * 32,
            total_frames=2 * 4 * 32 * 2,
            start_method="forkserver",
        ) as c:
            with anyio.fail_after(60):
                batches = [batch async for batch in c]
    assert len(batches) == 2
    for batch in batches:
        check_layout(batch, (2, 4, 32))
    assert assert_real_cartpole_transitions(torch.cat(batches, dim=-1)) >= 2


# -- seeds: EnvPool seeds its sub-envs once, when built (sub-env i with seed + i) ---------------------------------
def test_only_workers_whose_seeds_overlap_are_named() -> None:
    assert shared_seeds_warning([(0, 4), (4, 4), (None, 4), (None, 4)]) is None  # spaced by num_envs; not EnvPool
    message = shared_seeds_warning([(0, 4), (8, 4), (2, 4)])
    assert message is not None
    assert message.startswith("workers 0 and 2 step EnvPool envs whose seeds overlap (worker 0 seed=0, worker 2 seed=2")
    assert "EnvPool's default" not in message
    assert "42 is EnvPool's default" in str(shared_seeds_warning([(42, 4), (42, 4)]))


async def test_workers_sharing_an_envpool_seed_are_warned_of_when_the_collector_starts() -> None:
    collector = MultiSyncCollector(
        [functools.partial(make_cartpole, 4, seed=0)] * 2, frames_per_batch=2 * 4 * 4, start_method="forkserver"
    )
    match = r"workers 0 and 1 step EnvPool envs whose seeds overlap \(worker 0 seed=0, worker 1 seed=0.*seed=4 \* i"
    with no_leaks(), anyio.fail_after(60):
        try:
            with pytest.warns(UserWarning, match=match):  # the workers said what they built: it warns as it starts
                batch = await anext(collector)
        finally:
            await collector.async_shutdown()
    # What the warning is about: the two workers stepped the same episodes.
    assert torch.equal(batch["observation"][0, :, 0], batch["observation"][1, :, 0])


def _seeded_at_build(kind: str) -> CollectorBase:
    if kind == "Collector":
        return Collector(functools.partial(make_cartpole, 4, seed=3), frames_per_batch=16)
    factories = [functools.partial(make_cartpole, 4, seed=3 + 4 * i) for i in range(2)]
    return MultiSyncCollector(factories, frames_per_batch=32, start_method="forkserver")


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
async def test_set_seed_on_a_started_collector_raises_at_once(kind: str) -> None:
    with no_leaks():
        async with _seeded_at_build(kind) as collector:
            with anyio.fail_after(60):
                await anext(collector)
                with pytest.raises(
                    ConfigurationError,
                    match=r"seed=0 is invalid: .* when it is built \((this one|worker 0's) with seed=3",
                ):
                    collector.set_seed(0)
                await anext(collector)  # nothing was staged: it goes on


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
async def test_set_seed_before_the_start_raises_when_the_envs_are_known(kind: str) -> None:
    collector = _seeded_at_build(kind)
    with no_leaks():
        collector.set_seed(0)  # nothing knows yet that the envs are EnvPool's
        with anyio.fail_after(60):
            # Not a RemoteError from a worker at the next batch: the collector's own error, as it starts.
            with pytest.raises(ConfigurationError, match=r"seed=0 is invalid: expected no seed after the env is built"):
                await anext(collector)
            await anext(collector)  # the refused seed was dropped: it starts without it
        await collector.async_shutdown()


def test_leaves_numpy_cannot_view_are_written_through_staging() -> None:
    # Non-contiguous leaves take the path of CUDA tensors: numpy staging arrays copied in once per step.
    with EnvPoolEnv(make_cartpole(4)) as env:
        root, nxt = env.make_root(), env.make_next()
        for td in (root, nxt):
            td.set("observation", torch.zeros(4, 8)[:, ::2], inplace=False)
        env.reset_into(root)
        steps = []
        for _ in range(60):
            before, action = root.clone(), env.action_spec.rand(env.batch_size)
            env.step_and_reset_into(action, nxt, root)
            steps.append(before.set("action", action).set("next", nxt.clone()))
        assert not nxt["observation"].is_contiguous()
    assert assert_real_cartpole_transitions(torch.stack(steps, dim=1)) >= 4


@pytest.mark.gpu
def test_on_cuda_the_env_writes_device_tensors() -> None:
    with EnvPoolEnv(make_cartpole(4), device="cuda") as env:
        assert env.observation_spec["observation"].device.type == "cuda"
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root)
        steps = []
        for _ in range(60):
            before, action = root.clone(), env.action_spec.rand(env.batch_size)
            env.step_and_reset_into(action, nxt, root)
            steps.append(before.set("action", action).set("next", nxt.clone()))
        env.reset_into(root, mask=torch.tensor([True, False, True, False], device="cuda"))
        assert root["observation"].device.type == "cuda"
    batch = torch.stack(steps, dim=1)
    assert batch["next", "observation"].device.type == "cuda"
    assert assert_real_cartpole_transitions(batch.cpu()) >= 4
