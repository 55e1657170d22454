"""GymEnv, the TorchRL adapter and make_env, against real gymnasium (and TorchRL) envs.

Autoreset is checked with counting envs (see ``acollect.testing``): a transition that did
not happen, or a reset observation passed off as a final one, breaks ``next_obs - obs == 1``.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from tensordict import TensorDict

from acollect.envs import EnvBase, GymEnv, TorchRLEnvAdapter, make_env, space_to_spec
from acollect.envs._factory import check_env_arg, known_num_envs
from acollect.envs._gym import check_env_id
from acollect.errors import ConfigurationError, EnvError, PolicyError
from acollect.specs import Binary, Bounded, Categorical, Composite, MultiCategorical, OneHot
from acollect.testing import ENV_STRIDE, RESET_JUMP, CountingEnv, CountingGymEnv, assert_counting_batch


def collect(env: EnvBase, steps: int, *, seed: int | None = None, actions: torch.Tensor | None = None) -> TensorDict:
    """Drives ``env`` like the rollout engine does and returns a ``[n_envs, steps]`` batch."""
    root, nxt = env.make_root(), env.make_next()
    env.reset_into(root, seed=seed)
    rows = []
    for t in range(steps):
        action = env.action_spec.rand(env.batch_size) if actions is None else actions[t]
        before = root.clone()
        env.step_and_reset_into(action, nxt, root)
        rows.append(before.set("action", action).set("next", nxt.clone()))
    return torch.stack(rows, dim=1)


def counting_fns(lengths: list[int]) -> list[Any]:
    return [functools.partial(CountingGymEnv, n, start=i * ENV_STRIDE) for i, n in enumerate(lengths)]


def check_episodes(batch: TensorDict, lengths: list[int]) -> None:
    """Every sub-env ended an episode exactly every ``lengths[i]`` steps, with the true final observation."""
    assert_counting_batch(batch)
    done = batch["next", "done"].squeeze(-1)
    for i, length in enumerate(lengths):
        expected = torch.tensor([(t + 1) % length == 0 for t in range(batch.shape[1])])
        assert torch.equal(done[i], expected), (i, done[i])
    final = batch["next", "observation"][done]
    assert torch.equal(torch.remainder(final, ENV_STRIDE) > 0, torch.ones_like(final, dtype=torch.bool))
    assert torch.equal(batch["next", "terminated"], batch["next", "done"])
    assert not batch["next", "truncated"].any()
    assert not batch["done"].any()  # what a step starts from is never a finished episode


# -- gymnasium ids -----------------------------------------------------------------------------------
def test_cartpole_specs_shapes_and_flags() -> None:
    with GymEnv("CartPole-v1", num_envs=3) as env:
        assert env.batch_size == (3,)
        assert env.action_spec == Categorical(2)
        assert env.observation_spec.leaf_keys() == [("observation",)]
        assert env.autoreset_mode == AutoresetMode.SAME_STEP
        batch = collect(env, 60, seed=0)
    assert batch.shape == (3, 60)
    assert batch["observation"].dtype == torch.float32
    assert batch["next", "reward"].shape == (3, 60, 1)
    assert batch["next", "reward"].dtype == torch.float32
    assert torch.equal(batch["next", "done"], batch["next", "terminated"] | batch["next", "truncated"])
    assert batch["next", "done"].any(), "a random CartPole policy ends episodes within 60 steps"
    assert not batch["done"].any()
    # Within an episode the next step starts where the last one ended; after an end it starts afresh.
    same = (batch["observation"][:, 1:] == batch["next", "observation"][:, :-1]).all(-1)
    assert torch.equal(same, ~batch["next", "done"][:, :-1].squeeze(-1))


def test_pendulum_box_action_and_truncation() -> None:
    with GymEnv("Pendulum-v1", num_envs=2) as env:
        assert env.action_spec == Bounded(-2.0, 2.0, (1,))
        assert env.observation_spec["observation"].shape == (3,)
        batch = collect(env, 201, seed=3)
    truncated = batch["next", "truncated"].squeeze(-1)
    assert truncated[:, 199].all()
    assert truncated.sum() == 2
    assert not batch["next", "terminated"].any()
    assert not torch.equal(batch["observation"][:, 200], batch["next", "observation"][:, 199])


def test_seeds_reproduce_and_sub_env_i_gets_seed_plus_i() -> None:
    actions = torch.randint(2, (40, 2), generator=torch.Generator().manual_seed(0))
    with GymEnv("CartPole-v1", num_envs=2) as a, GymEnv("CartPole-v1", num_envs=2) as b:
        first, second = collect(a, 40, seed=11, actions=actions), collect(b, 40, seed=11, actions=actions)
        other = collect(b, 40, seed=12, actions=actions)
    assert torch.equal(first["observation"][:, 0], second["observation"][:, 0])
    assert torch.equal(first["next", "observation"], second["next", "observation"])
    assert not torch.equal(first["observation"][:, 0], other["observation"][:, 0])
    with GymEnv("CartPole-v1") as single:
        root = single.reset(seed=12)
    assert torch.equal(root["observation"][0], first["observation"][1, 0])


def test_async_vectorization_runs_sub_envs_in_processes() -> None:
    with GymEnv("CartPole-v1", num_envs=2, vectorization="async") as env:
        assert isinstance(env.env, AsyncVectorEnv)
        batch = collect(env, 30, seed=0)
    assert batch["next", "observation"].shape == (2, 30, 4)


def test_gym_make_kwargs_reach_every_sub_env() -> None:
    with GymEnv("CartPole-v1", num_envs=2, max_episode_steps=5) as env:
        batch = collect(env, 5, seed=0)
    assert batch["next", "done"][:, 4].all()


def test_unknown_id_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"env='NoSuchEnv-v9' is not a registered gymnasium id"):
        GymEnv("NoSuchEnv-v9")
    with pytest.raises(ConfigurationError, match=r"env='CartPol-v1'.*did you mean 'CartPole-v1'\?"):
        GymEnv("CartPol-v1")
    with pytest.raises(ConfigurationError, match=r"module 'no_such_module'.*cannot be imported"):
        GymEnv("no_such_module:Thing-v0")


def test_ids_gymnasium_make_takes_are_accepted() -> None:
    check_env_id("CartPole-v1")
    check_env_id("CartPole")  # unversioned: gymnasium.make takes the latest version
    check_env_id("gymnasium.envs.classic_control:CartPole-v1")  # "module:id" imports the module first


def test_what_an_env_argument_says_without_building_it() -> None:
    assert known_num_envs("CartPole-v1", {}) == 1
    assert known_num_envs("CartPole-v1", {"num_envs": 4}) == 4
    assert known_num_envs(functools.partial(GymEnv, "CartPole-v1", num_envs=3), {}) == 3
    assert known_num_envs(functools.partial(GymEnv, "CartPole-v1", num_envs=3), {"num_envs": 5}) == 5
    assert known_num_envs(CountingEnv(num_envs=2), {}) == 2
    assert known_num_envs(lambda: CountingEnv(num_envs=2), {}) is None  # only building it would tell
    assert known_num_envs(CountingEnv, {}) is None
    check_env_arg(lambda: None)  # nothing to check without calling it
    with pytest.raises(ConfigurationError, match="did you mean 'CartPole-v1'"):
        check_env_arg(functools.partial(GymEnv, "CartPol-v1", num_envs=2))
    with pytest.raises(ConfigurationError, match="did you mean 'CartPole-v1'"):
        check_env_arg(functools.partial(gym.make, "CartPol-v1"))


def test_bad_make_kwargs_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="could not be built") as info:
        GymEnv("CartPole-v1", no_such_argument=1)
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs=0"),
        ({"num_envs": 2.0}, "num_envs=2.0"),
        ({"vectorization": "threads"}, "vectorization='threads'"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        GymEnv("CartPole-v1", **kwargs)


def test_instance_arguments_are_checked() -> None:
    vec = SyncVectorEnv(CountingGymEnv.env_fns(2))
    with pytest.raises(ConfigurationError, match="num_envs=3"):
        GymEnv(vec, num_envs=3)
    with pytest.raises(ConfigurationError, match="kwargs"):
        GymEnv(vec, render_mode="human")
    with pytest.raises(ConfigurationError, match="num_envs=2"):
        GymEnv(CountingGymEnv(), num_envs=2)
    with pytest.raises(ConfigurationError, match="env=42"):
        GymEnv(42)  # type: ignore[arg-type]
    assert not vec.closed  # a failed wrap leaves the caller's env alone
    vec.close()


# -- autoreset: no transition that did not happen, ever --------------------------------------------
def test_own_vector_env_same_step() -> None:
    lengths = [3, 3, 3]
    with GymEnv(functools.partial(CountingGymEnv, 3), num_envs=3) as env:
        assert env.autoreset_mode == AutoresetMode.SAME_STEP
        check_episodes(collect(env, 20), lengths)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
@pytest.mark.parametrize("copy", [True, False])
def test_user_sync_vector_env_in_every_autoreset_mode(mode: AutoresetMode, copy: bool) -> None:
    lengths = [2, 3, 5]
    with GymEnv(SyncVectorEnv(counting_fns(lengths), autoreset_mode=mode, copy=copy)) as env:
        assert env.autoreset_mode == mode
        check_episodes(collect(env, 31), lengths)


def test_user_async_vector_env_next_step() -> None:
    lengths = [2, 3]
    with GymEnv(AsyncVectorEnv(counting_fns(lengths), autoreset_mode=AutoresetMode.NEXT_STEP)) as env:
        check_episodes(collect(env, 13), lengths)
        assert env.env.closed is False
    assert env.env.closed


def test_async_without_shared_memory_in_next_step_mode_is_refused() -> None:
    # gymnasium keeps that worker's autoreset flag through a masked reset: the next step would be a no-op.
    vec = AsyncVectorEnv(counting_fns([2]), shared_memory=False, autoreset_mode=AutoresetMode.NEXT_STEP)
    try:
        with pytest.raises(ConfigurationError, match="shared_memory"):
            GymEnv(vec)
    finally:
        vec.close()


class _ResetRowsOnly(SyncVectorEnv):
    """A vector env whose masked reset returns the reset sub-envs' rows only (as EnvPool's reset does)."""

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        mask = None if options is None else options.get("reset_mask")  # read first: gymnasium pops it
        obs, info = super().reset(seed=seed, options=options)
        return (obs, info) if mask is None else (obs[mask], info)


def test_a_masked_reset_that_returns_some_rows_only_is_an_env_error() -> None:
    # Indexing its answer by sub-env would pick the wrong rows (or fail with an IndexError that says nothing).
    lengths = [3, 2, 5]
    with GymEnv(_ResetRowsOnly(counting_fns(lengths))) as env:
        with pytest.raises(EnvError, match=r"shape \(1, 1\): expected one row for each of its 3 sub-envs"):
            collect(env, 2)
        root = env.make_root()
        env.reset_into(root)
        with pytest.raises(EnvError, match=r"_ResetRowsOnly\.reset"):
            env.reset_into(root, mask=torch.tensor([True, False, True]))


def test_wrapped_vector_env_keeps_its_mode() -> None:
    vec = gym.wrappers.vector.RecordEpisodeStatistics(SyncVectorEnv(counting_fns([2, 4])))
    with GymEnv(vec) as env:
        assert env.autoreset_mode == AutoresetMode.NEXT_STEP
        check_episodes(collect(env, 12), [2, 4])


def test_single_env_instance_is_reset_on_done() -> None:
    with GymEnv(CountingGymEnv(4, start=7)) as env:
        assert env.batch_size == (1,)
        batch = collect(env, 13)
    check_episodes(batch, [4])
    assert batch["observation"][0, 0].item() == 7


def test_truncation_from_a_time_limit() -> None:
    with GymEnv(lambda: gym.wrappers.TimeLimit(CountingGymEnv(100), max_episode_steps=3), num_envs=2) as env:
        batch = collect(env, 9)
    assert_counting_batch(batch)
    assert torch.equal(batch["next", "truncated"], batch["next", "done"])
    assert batch["next", "truncated"].squeeze(-1)[:, 2::3].all()
    assert not batch["next", "terminated"].any()


# -- partial resets (the engine's max_frames_per_traj) ---------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: GymEnv(functools.partial(CountingGymEnv, 50), num_envs=3),
        lambda: GymEnv(SyncVectorEnv(counting_fns([50, 50, 50]))),
        lambda: GymEnv(AsyncVectorEnv(counting_fns([50, 50, 50]), autoreset_mode=AutoresetMode.SAME_STEP)),
    ],
    ids=["own", "sync-next-step", "async-same-step"],
)
def test_reset_into_with_a_mask_resets_only_those_sub_envs(make: Any) -> None:
    with make() as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root)
        for _ in range(3):
            env.step_and_reset_into(torch.zeros(3, dtype=torch.int64), nxt, root)
        before = root["observation"].clone()
        root["done"][:] = True  # as if the engine had flagged them; a reset clears the flag
        env.reset_into(root, mask=torch.tensor([True, False, True]))
        assert torch.equal(root["observation"][[0, 2]], before[[0, 2]] + RESET_JUMP)
        assert torch.equal(root["observation"][1], before[1])
        assert not root["done"][[0, 2]].any()
        assert root["done"][1].all()
        env.step_and_reset_into(torch.zeros(3, dtype=torch.int64), nxt, root)
        assert torch.equal(nxt["observation"][[0, 2]], before[[0, 2]] + RESET_JUMP + 1)
        assert torch.equal(nxt["observation"][1], before[1] + 1)


def test_reset_into_mask_on_a_single_env_and_bad_masks() -> None:
    with GymEnv(CountingGymEnv(9)) as env:
        root = env.reset()
        env.reset_into(root, mask=torch.tensor([False]))
        assert root["observation"].item() == 0
        env.reset_into(root, mask=torch.tensor([True]))
        assert root["observation"].item() == RESET_JUMP
        with pytest.raises(ConfigurationError, match="mask"):
            env.reset_into(root, mask=torch.tensor([True, False]))


# -- the hot path's buffers ------------------------------------------------------------------------
def test_new_tensordicts_are_picked_up_and_old_ones_left_alone() -> None:
    with GymEnv(functools.partial(CountingGymEnv, 50), num_envs=2) as env:
        root_a, next_a = env.make_root(), env.make_next()
        env.reset_into(root_a)
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), next_a, root_a)
        root_b, next_b = root_a.clone(), env.make_next()
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), next_b, root_b)
        assert next_a["observation"].squeeze(-1).tolist() == [1.0, 1.0]
        assert next_b["observation"].squeeze(-1).tolist() == [2.0, 2.0]
        assert root_b["observation"].squeeze(-1).tolist() == [2.0, 2.0]


def test_non_contiguous_leaves_are_written_through_a_staging_copy() -> None:
    with GymEnv(SyncVectorEnv(counting_fns([2, 2]))) as env:
        root, nxt = env.make_root(), env.make_next()
        nxt.set("observation", torch.zeros(2, 2)[:, :1])  # a strided view: no flat numpy alias
        assert not nxt["observation"].is_contiguous()
        env.reset_into(root)
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), nxt, root)
        assert nxt["observation"].squeeze(-1).tolist() == [1.0, ENV_STRIDE + 1.0]
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), nxt, root)
        assert nxt["observation"].squeeze(-1).tolist() == [2.0, ENV_STRIDE + 2.0]
        assert root["observation"].squeeze(-1).tolist() == [2.0 + RESET_JUMP, ENV_STRIDE + 2.0 + RESET_JUMP]


def test_actions_with_grad_or_an_extra_dim_are_accepted() -> None:
    with GymEnv("Pendulum-v1", num_envs=2) as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root, seed=0)
        env.step_and_reset_into(torch.zeros(2, 1, requires_grad=True), nxt, root)
    with GymEnv("CartPole-v1", num_envs=2) as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root, seed=0)
        env.step_and_reset_into(torch.zeros(2, 1, dtype=torch.int64), nxt, root)
        with pytest.raises(PolicyError, match=r"expected shape \(2,\)"):
            env.step_and_reset_into(torch.zeros(3, dtype=torch.int64), nxt, root)


@pytest.mark.parametrize(
    "vectorization",
    # AsyncVectorEnv logs a worker's error through warnings (an error filter would raise those instead).
    ["sync", pytest.param("async", marks=pytest.mark.filterwarnings("ignore:.*ERROR:"))],
)
def test_an_action_outside_the_action_space_is_a_policy_error_naming_the_spec(vectorization: str) -> None:
    with GymEnv("CartPole-v1", num_envs=2, vectorization=vectorization) as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root, seed=0)
        outside = r"action 7 \(sub-env 1\) is outside the action space.*Categorical"
        with pytest.raises(PolicyError, match=outside) as info:
            env.step_and_reset_into(torch.tensor([0, 7]), nxt, root)
    assert isinstance(info.value.__cause__, AssertionError)  # gymnasium's own check, kept as the cause


class _BrokenStep(CountingGymEnv):
    def step(self, action: Any) -> Any:
        raise AssertionError("the env's own bug")


def test_an_env_error_with_a_valid_action_is_left_as_it_is() -> None:
    with GymEnv(_BrokenStep, num_envs=2) as env:
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root, seed=0)
        with pytest.raises(AssertionError, match="the env's own bug"):
            env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), nxt, root)


def test_closed_env_refuses_to_run_and_closes_the_gymnasium_env() -> None:
    env = GymEnv("CartPole-v1", num_envs=2)
    root, nxt = env.make_root(), env.make_next()
    env.close()
    env.close()
    assert env.is_closed
    assert env.env.closed
    with pytest.raises(EnvError, match="closed"):
        env.reset()
    with pytest.raises(EnvError, match="closed"):
        env.reset_into(root)
    with pytest.raises(EnvError, match="closed"):
        env.step_and_reset_into(torch.zeros(2, dtype=torch.int64), nxt, root)


# -- spaces ------------------------------------------------------------------------------------------
class SpaceEnv(gym.Env[Any, Any]):
    """Observes samples of any space and checks every action it gets against its action space."""

    def __init__(self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]) -> None:
        self.observation_space, self.action_space = observation_space, action_space
        self.observations: list[Any] = []
        self.actions: list[Any] = []

    def _observe(self) -> Any:
        self.observations.append(self.observation_space.sample())
        return self.observations[-1]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self._observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(action), action
        self.actions.append(action)
        return self._observe(), 0.5, False, False, {}


def _flatten(obs: Any, prefix: tuple[str, ...]) -> dict[tuple[str, ...], Any]:
    if isinstance(obs, dict):
        return {k: v for key, sub in obs.items() for k, v in _flatten(sub, (*prefix, str(key))).items()}
    if isinstance(obs, tuple):
        return {k: v for i, sub in enumerate(obs) for k, v in _flatten(sub, (*prefix, str(i))).items()}
    return {prefix: obs}


NESTED = spaces.Dict(
    {
        "pos": spaces.Box(-1.0, 1.0, (2,), np.float64),
        "inner": spaces.Dict({"flag": spaces.MultiBinary(3), "cell": spaces.Discrete(4, start=1)}),
        "pair": spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 3]))),
    }
)


@pytest.mark.parametrize(
    ("observation_space", "keys"),
    [
        (spaces.Box(0, 255, (2, 2), np.uint8), [("observation",)]),
        (spaces.Discrete(5), [("observation",)]),
        (spaces.Tuple((spaces.Box(-1, 1, (1,)), spaces.Discrete(3))), [("observation", "0"), ("observation", "1")]),
        (NESTED, [("pos",), ("inner", "flag"), ("inner", "cell"), ("pair", "0"), ("pair", "1")]),
    ],
    ids=["box-uint8", "discrete", "tuple", "nested-dict"],
)
@pytest.mark.parametrize("vector", [False, True])
def test_observation_spaces_map_to_keys_and_values_arrive_intact(
    observation_space: spaces.Space[Any], keys: list[tuple[str, ...]], vector: bool
) -> None:
    def make() -> SpaceEnv:
        return SpaceEnv(observation_space, spaces.Discrete(2))

    env = GymEnv(make, num_envs=2) if vector else GymEnv(make())
    subs = list(env.env.envs) if vector else [env.env]
    with env:
        assert sorted(env.observation_spec.leaf_keys()) == sorted(keys)
        batch = collect(env, 4, seed=0)
    for i, sub in enumerate(subs):
        for t in range(4):
            for key, value in _flatten(sub.observations[t + 1], ()).items():
                top = () if isinstance(observation_space, spaces.Dict) else ("observation",)
                td_key = ("next", *top, *key)
                got = batch[td_key][i, t]
                assert torch.equal(got, torch.as_tensor(np.asarray(value)).to(got.dtype)), (key, t)
                assert env.observation_spec[td_key[1:]].is_in(got)


def test_space_to_spec_mapping() -> None:
    assert space_to_spec(spaces.Box(-1, 1, (3,), np.float64)) == Bounded(-1.0, 1.0, (3,), dtype=torch.float64)
    assert space_to_spec(spaces.Discrete(4, start=2)) == Categorical(4, start=2)
    assert space_to_spec(spaces.Discrete(4), categorical=False) == OneHot(4)
    assert space_to_spec(spaces.MultiDiscrete([2, 5])) == MultiCategorical([2, 5])
    assert space_to_spec(spaces.MultiBinary(4)) == Binary(4)
    nested = space_to_spec(NESTED)
    assert isinstance(nested, Composite)
    assert nested["inner", "cell"] == Categorical(4, start=1)
    assert nested["pair", "1"] == MultiCategorical([2, 3])


@pytest.mark.parametrize(
    ("action_space", "encoding", "sample"),
    [
        (spaces.Discrete(3), True, torch.tensor([2, 0])),
        (spaces.Discrete(3, start=-1), True, torch.tensor([-1, 1])),
        (spaces.Discrete(3), False, torch.tensor([[0, 0, 1], [1, 0, 0]])),
        (spaces.MultiDiscrete([2, 4]), True, torch.tensor([[1, 3], [0, 2]])),
        (spaces.MultiBinary(3), True, torch.tensor([[1, 0, 1], [0, 0, 0]], dtype=torch.int8)),
        (spaces.Box(-2.0, 2.0, (2,), np.float32), True, torch.tensor([[0.5, -1.0], [2.0, 0.0]])),
    ],
    ids=["discrete", "discrete-start", "one-hot", "multi-discrete", "multi-binary", "box"],
)
def test_action_spaces_round_trip(action_space: spaces.Space[Any], encoding: bool, sample: torch.Tensor) -> None:
    with GymEnv(
        lambda: SpaceEnv(spaces.Box(-1, 1, (1,)), action_space), num_envs=2, categorical_action_encoding=encoding
    ) as env:
        assert env.action_spec.is_in(sample)
        for _ in range(5):
            assert env.action_spec.is_in(env.action_spec.rand((2,)))
        root, nxt = env.make_root(), env.make_next()
        env.reset_into(root, seed=0)
        env.step_and_reset_into(sample, nxt, root)
        got = [sub.actions[-1] for sub in env.env.envs]
    expected = sample.argmax(-1) if not encoding else sample
    for i in range(2):
        assert np.array_equal(np.asarray(got[i]), expected[i].numpy())
    assert torch.equal(nxt["reward"], torch.full((2, 1), 0.5))


@pytest.mark.parametrize(
    ("observation_space", "action_space", "match"),
    [
        (spaces.Text(5), spaces.Discrete(2), "Text"),
        (spaces.Box(-1, 1, (1,)), spaces.Dict({"a": spaces.Discrete(2)}), "action_space"),
        (spaces.Dict({"reward": spaces.Discrete(2)}), spaces.Discrete(2), "reserved"),
    ],
    ids=["text-observation", "dict-action", "reserved-key"],
)
def test_unsupported_spaces_are_configuration_errors(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any], match: str
) -> None:
    single = SpaceEnv(observation_space, action_space)
    with pytest.raises(ConfigurationError, match=match):
        GymEnv(single)
    with pytest.raises(ConfigurationError, match=match):
        GymEnv(lambda: SpaceEnv(observation_space, action_space), num_envs=2)


# -- make_env ----------------------------------------------------------------------------------------
def test_make_env_dispatch() -> None:
    counting = CountingEnv(num_envs=2)
    assert make_env(counting) is counting
    made = make_env(CountingEnv, num_envs=3, episode_length=4)
    assert isinstance(made, CountingEnv)
    assert made.num_envs == 3
    with make_env("CartPole-v1", num_envs=2) as env:
        assert isinstance(env, GymEnv)
        assert env.num_envs == 2
    with make_env(CountingGymEnv(3)) as env:
        assert isinstance(env, GymEnv)
        assert env.num_envs == 1
    with make_env(SyncVectorEnv(CountingGymEnv.env_fns(2)), categorical_action_encoding=False) as env:
        assert env.num_envs == 2
        assert isinstance(env.action_spec, OneHot)
    with make_env(lambda: "CartPole-v1") as env:
        assert isinstance(env, GymEnv)
    with make_env(lambda length: CountingGymEnv(length), length=2) as env:
        check_episodes(collect(env, 6), [2])


@pytest.mark.parametrize(
    ("create_env_fn", "kwargs", "match"),
    [
        (42, {}, r"create_env_fn=42 is invalid: expected an acollect EnvBase, a gymnasium id"),
        (lambda: 42, {}, r"returned 42: expected it to return an acollect EnvBase"),
        (CountingEnv(), {"num_envs": 2}, r"env_kwargs=\{'num_envs': 2\}"),
    ],
    ids=["int", "callable-returning-int", "instance-with-kwargs"],
)
def test_make_env_errors(create_env_fn: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        make_env(create_env_fn, **kwargs)


# -- TorchRL (only where torchrl is installed) -------------------------------------------------------
@pytest.mark.torchrl
def test_torchrl_unbatched_env_gets_a_batch_dim() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs.libs.gym import GymWrapper

    with make_env(GymWrapper(CountingGymEnv(3))) as env:
        assert isinstance(env, TorchRLEnvAdapter)
        assert env.batch_size == (1,)
        assert env.action_spec.rand((1,)).shape == (1, 2)  # TorchRL's one-hot default
        check_episodes(collect(env, 10), [3])


@pytest.mark.torchrl
def test_torchrl_batched_env_and_partial_resets() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import SerialEnv
    from torchrl.envs.libs.gym import GymWrapper

    fns = [lambda i=i: GymWrapper(CountingGymEnv(4, start=i * ENV_STRIDE)) for i in range(2)]
    with TorchRLEnvAdapter(SerialEnv(2, fns)) as env:
        assert env.batch_size == (2,)
        assert env.observation_spec["observation"].shape == (1,)
        check_episodes(collect(env, 9), [4, 4])
        root = env.make_root()
        env.reset_into(root)
        before = root["observation"].clone()
        env.reset_into(root, mask=torch.tensor([False, True]))
        assert root["observation"][0] == before[0]
        assert root["observation"][1] == before[1] + RESET_JUMP


@pytest.mark.torchrl
def test_torchrl_cartpole_rollout() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs.libs.gym import GymEnv as TorchRLGymEnv

    with TorchRLEnvAdapter(TorchRLGymEnv("CartPole-v1")) as env:
        batch = collect(env, 40, seed=0)
    assert batch["next", "observation"].shape == (1, 40, 4)
    assert batch["next", "done"].any()
    assert torch.equal(batch["next", "done"], batch["next", "terminated"] | batch["next", "truncated"])


def test_torchrl_adapter_rejects_other_objects() -> None:
    with pytest.raises(ConfigurationError, match="torchrl"):
        TorchRLEnvAdapter(CountingEnv())


# -- devices -----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gym_env_on_cuda_writes_device_tensors() -> None:
    with GymEnv(SyncVectorEnv(counting_fns([2, 3])), device="cuda") as env:
        assert env.observation_spec["observation"].device.type == "cuda"
        root, nxt = env.make_root(), env.make_next()
        assert nxt["reward"].device.type == "cuda"
        batch = collect(env, 7)
        env.reset_into(root)
        env.reset_into(root, mask=torch.tensor([True, False], device="cuda"))
        assert root["observation"].device.type == "cuda"
    assert batch["next", "observation"].device.type == "cuda"
    check_episodes(batch.cpu(), [2, 3])


@pytest.mark.gpu
def test_counting_env_on_cuda() -> None:
    env = CountingEnv(num_envs=2, episode_length=2, device="cuda")
    batch = collect(env, 5)
    assert batch["observation"].device.type == "cuda"
    check_episodes(batch.cpu(), [2, 2])
