"""PettingZooEnv: PettingZoo parallel envs as one batched env, agents stacked by group.

Values, not only shapes: a small deterministic env (rewards name the action each agent received, observations
count steps, one agent leaves mid-episode) checks action routing, masks, flags, per-copy resets and seeding;
mpe2's particle envs check the adapter against the raw env and TorchRL's wrapper.
"""

from __future__ import annotations

import functools
import itertools
from typing import ClassVar

import anyio
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from acollect.envs import PettingZooEnv
from acollect.envs._pettingzoo import default_group_map
from acollect.errors import ConfigurationError, PolicyError
from acollect.specs import Bounded, Categorical, OneHot

pettingzoo = pytest.importorskip("pettingzoo")
simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
simple_tag_v3 = pytest.importorskip("mpe2.simple_tag_v3")

GROUPS = {"red": ["red_0", "red_1"], "blue": ["blue_0"]}


class TeamEnv(pettingzoo.ParallelEnv):
    """Two red agents (Discrete(3) actions) and one blue agent (Box(-1, 1, (2,)) actions).

    Observations: red_j sees ``[t, offset + j]``, blue_0 sees ``[t, offset, a0 + a1]`` (its last action),
    where ``t`` counts the episode's steps and ``offset`` is drawn from the env's RNG at each reset.
    Rewards: red_j gets ``action + 10 * j``, blue_0 ``a0 + a1``. red_1 terminates at step ``leave_at``;
    at step ``episode_length`` every agent left terminates (or is truncated, with ``truncate_at_end``).
    A step must get actions for exactly the live agents, as a PettingZoo parallel env takes them.
    """

    metadata: ClassVar[dict[str, str]] = {"name": "team_v0"}

    def __init__(self, episode_length: int = 4, leave_at: int = 2, truncate_at_end: bool = False) -> None:
        self.possible_agents = ["red_0", "red_1", "blue_0"]
        self.agents: list[str] = []
        self.episode_length, self.leave_at, self.truncate_at_end = episode_length, leave_at, truncate_at_end
        self._rng = np.random.default_rng()
        self.closed = False
        self.t, self.offset = 0, 0.0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (2,) if agent.startswith("red") else (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3) if agent.startswith("red") else spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self, agent: str, last: float = 0.0) -> np.ndarray:
        if agent == "blue_0":
            return np.array([self.t, self.offset, last], np.float32)
        return np.array([self.t, self.offset + int(agent[-1])], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.offset = float(self._rng.integers(1000))
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        if sorted(actions) != sorted(self.agents):
            raise ValueError(f"actions for {sorted(actions)}, live agents {sorted(self.agents)}")
        self.t += 1
        rewards = {}
        for a, act in actions.items():
            if a == "blue_0":
                assert self.action_space(a).contains(act), act
                rewards[a] = float(np.sum(act))
            else:
                assert isinstance(act, int), type(act)
                rewards[a] = float(act) + 10 * int(a[-1])
        terms = {a: a == "red_1" and self.t == self.leave_at for a in self.agents}
        truncs = dict.fromkeys(self.agents, False)
        if self.t >= self.episode_length:
            for a in self.agents:
                (truncs if self.truncate_at_end else terms)[a] = True
        obs = {a: self._obs(a, rewards[a]) for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def close(self) -> None:
        self.closed = True


class MaskedTeamEnv(TeamEnv):
    """TeamEnv whose red agents observe a Dict: their position and an action mask (action 2 is never allowed)."""

    def observation_space(self, agent: str) -> spaces.Space:
        if agent.startswith("red"):
            return spaces.Dict(
                {"pos": spaces.Box(-np.inf, np.inf, (2,), np.float32), "action_mask": spaces.MultiBinary(3)}
            )
        return super().observation_space(agent)

    def _obs(self, agent: str, last: float = 0.0):
        obs = super()._obs(agent, last)
        return obs if agent == "blue_0" else {"pos": obs, "action_mask": np.array([1, 1, 0], np.int8)}


class DictActionEnv(TeamEnv):
    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Dict({"move": spaces.Discrete(2)})


def actions(env: PettingZooEnv, red: list[list[int]], blue: list[list[float]]) -> TensorDict:
    """One step's action TensorDict: red ``[n_envs, 2]`` indices, blue ``[n_envs, 2]`` (one agent's Box)."""
    return TensorDict(
        {
            "red": {"action": torch.tensor(red, dtype=torch.int64)},
            "blue": {"action": torch.tensor(blue, dtype=torch.float32).unsqueeze(1)},
        },
        batch_size=[env.num_envs],
    )


def col(td: TensorDict, *key: str) -> list:
    return td.get(key).squeeze(-1).tolist()


def test_default_groups_follow_torchrl_name_prefixes() -> None:
    assert default_group_map(["red_0", "red_1", "blue_0"]) == GROUPS
    odd = {"solo": ["solo"], "a_b": ["a_b_1", "a_b_0"], "x_y": ["x_y"]}  # no integer suffix: a group of its own
    assert default_group_map(["solo", "a_b_1", "a_b_0", "x_y"]) == odd


def test_specs_stack_each_groups_agents() -> None:
    with PettingZooEnv(TeamEnv, num_envs=2) as env:
        assert env.group_map == GROUPS
        assert env.batch_size == torch.Size([2])
        assert env.action_keys == [("red", "action"), ("blue", "action")]
        assert env.reward_keys == [("red", "reward"), ("blue", "reward")]
        assert env.done_keys[:3] == [("done",), ("terminated",), ("truncated",)]
        assert set(env.done_keys[3:]) == {(g, k) for g in GROUPS for k in ("done", "terminated", "truncated")}
        assert env.action_spec["red", "action"] == Categorical(3, shape=(2,))
        blue = env.action_spec["blue", "action"]
        assert isinstance(blue, Bounded)
        assert blue.shape == (1, 2)
        assert blue.dtype == torch.float32
        assert blue.low.tolist() == [[-1.0, -1.0]]
        assert blue.high.tolist() == [[1.0, 1.0]]
        root = env.make_root()
        assert root["red", "observation"].shape == (2, 2, 2)
        assert root["blue", "observation"].shape == (2, 1, 3)
        assert root["red", "mask"].dtype == torch.bool
        assert root["red", "mask"].shape == (2, 2)
        assert root["red", "done"].shape == (2, 2, 1)
        assert root["blue", "truncated"].dtype == torch.bool
        assert env.make_next()["red", "reward"].shape == (2, 2, 1)


def test_a_step_routes_each_agents_action_and_writes_its_reward() -> None:
    with PettingZooEnv(TeamEnv, num_envs=2) as env:
        root = env.reset(seed=0)
        offsets = root["blue", "observation"][:, 0, 1].tolist()
        assert root["red", "observation"].tolist() == [[[0.0, off], [0.0, off + 1]] for off in offsets]
        assert root["red", "mask"].all()
        assert not root["done"].any()
        assert not root["red", "done"].any()
        nxt = env.step(actions(env, [[2, 1], [0, 2]], [[0.5, 0.25], [-1.0, 1.0]]))
        assert col(nxt, "red", "reward") == [[2.0, 11.0], [0.0, 12.0]]
        assert col(nxt, "blue", "reward") == [[0.75], [0.0]]
        assert nxt["red", "observation"][..., 0].tolist() == [[1.0, 1.0], [1.0, 1.0]]
        assert nxt["blue", "observation"][:, 0].tolist() == [[1.0, offsets[0], 0.75], [1.0, offsets[1], 0.0]]
        assert nxt["red", "mask"].all()
        assert not nxt["done"].any()


def test_one_hot_actions_reach_the_env_as_indices() -> None:
    with PettingZooEnv(TeamEnv, categorical_actions=False) as env:
        assert env.action_spec["red", "action"] == OneHot(3, shape=(2, 3))
        env.reset(seed=0)
        action = env.action_spec.rand((1,))
        action["red", "action"] = torch.tensor([[[0, 0, 1], [0, 1, 0]]])
        assert col(env.step(action), "red", "reward") == [[2.0, 11.0]]


def test_an_agent_that_leaves_is_masked_zeroed_and_gets_no_action() -> None:
    # red_1 leaves at step 2 of 4; TeamEnv raises if it gets an action after that.
    with PettingZooEnv(TeamEnv) as env:
        env.reset(seed=0)
        step = functools.partial(env.step, actions(env, [[1, 2]], [[0.5, 0.5]]))
        assert step()["red", "mask"].tolist() == [[True, True]]
        nxt = step()  # red_1 leaves: its final observation and reward are real, its flags say how it left
        assert col(nxt, "red", "reward") == [[1.0, 12.0]]
        assert nxt["red", "observation"][0, 1, 0].item() == 2.0
        assert nxt["red", "mask"].tolist() == [[True, False]]
        assert col(nxt, "red", "terminated") == [[False, True]]
        assert col(nxt, "red", "done") == [[False, True]]
        assert col(nxt, "red", "truncated") == [[False, False]]
        assert not nxt["done"].any()
        assert env.last_root["red", "mask"].tolist() == [[True, False]]
        assert col(env.last_root, "red", "done") == [[False, True]]  # the next step starts from it
        nxt = step()  # gone: zero observation and reward, flags kept
        assert nxt["red", "observation"][0, 1].tolist() == [0.0, 0.0]
        assert col(nxt, "red", "reward") == [[1.0, 0.0]]
        assert col(nxt, "red", "terminated") == [[False, True]]
        assert nxt["red", "mask"].tolist() == [[True, False]]
        assert not nxt["done"].any()
        offset = env.last_root["blue", "observation"][0, 0, 1].item()
        nxt = step()  # the rest terminate: the episode ends, and the copy resets
        assert col(nxt, "terminated") == [True]
        assert col(nxt, "done") == [True]
        assert col(nxt, "truncated") == [False]
        assert col(nxt, "red", "terminated") == [[True, True]]
        assert col(nxt, "blue", "terminated") == [[True]]
        assert nxt["red", "mask"].tolist() == [[False, False]]
        assert nxt["blue", "observation"][0, 0, :2].tolist() == [4.0, offset]
        root = env.last_root
        assert root["red", "mask"].tolist() == [[True, True]]
        assert not root["red", "done"].any()
        assert not root["done"].any()
        assert root["red", "observation"][..., 0].tolist() == [[0.0, 0.0]]


def test_an_episode_some_agents_end_by_truncation_is_truncated_at_the_root() -> None:
    with PettingZooEnv(functools.partial(TeamEnv, episode_length=3, truncate_at_end=True)) as env:
        env.reset(seed=0)
        for _ in range(3):
            nxt = env.step(actions(env, [[0, 0]], [[0.0, 0.0]]))
        assert col(nxt, "done") == [True]
        assert col(nxt, "truncated") == [True]
        assert col(nxt, "terminated") == [False]
        assert col(nxt, "red", "terminated") == [[False, True]]
        assert col(nxt, "red", "truncated") == [[True, False]]
        assert col(nxt, "blue", "truncated") == [[True]]


def test_done_on_any_ends_the_episode_when_the_first_agent_leaves() -> None:
    with PettingZooEnv(TeamEnv, done_on_any=True) as env:
        env.reset(seed=0)
        assert col(env.step(actions(env, [[0, 0]], [[0.0, 0.0]])), "done") == [False]
        nxt = env.step(actions(env, [[0, 0]], [[0.0, 0.0]]))
        assert col(nxt, "done") == [True]
        assert col(nxt, "terminated") == [True]
        assert env.last_root["red", "mask"].tolist() == [[True, True]]
        assert env.last_root["red", "observation"][0, 0, 0] == 0


def test_each_copy_resets_when_its_own_episode_ends() -> None:
    lengths = itertools.cycle([2, 3])
    with PettingZooEnv(lambda: TeamEnv(episode_length=next(lengths), leave_at=99), num_envs=2) as env:
        env.reset(seed=0)
        times = []
        for _ in range(6):
            nxt = env.step(actions(env, [[0, 0], [0, 0]], [[0.0, 0.0], [0.0, 0.0]]))
            times.append(
                (nxt["red", "observation"][:, 0, 0].tolist(), env.last_root["red", "observation"][:, 0, 0].tolist())
            )
            assert col(nxt, "done") == [
                nxt["red", "observation"][0, 0, 0].item() == 2,
                nxt["red", "observation"][1, 0, 0].item() == 3,
            ]
        # (next t, root t) per step: copy 0 ends every 2 steps, copy 1 every 3, each restarting at t=0.
        assert times == [
            ([1, 1], [1, 1]), ([2, 2], [0, 2]), ([1, 3], [1, 0]), ([2, 1], [0, 1]), ([1, 2], [1, 2]), ([2, 3], [0, 0])
        ]  # fmt: skip


def test_reset_into_with_a_mask_resets_only_those_copies() -> None:
    with PettingZooEnv(TeamEnv, num_envs=2) as env:
        root = env.reset(seed=0)
        env.step(actions(env, [[0, 0], [0, 0]], [[0.0, 0.0], [0.0, 0.0]]))
        root = env.last_root
        assert root["red", "observation"][:, 0, 0].tolist() == [1.0, 1.0]
        root["done"][:] = True
        env.reset_into(root, mask=torch.tensor([False, True]))
        assert root["red", "observation"][:, 0, 0].tolist() == [1.0, 0.0]
        assert col(root, "done") == [True, False]


def rollout(env: PettingZooEnv, seed: int, steps: int) -> list[torch.Tensor]:
    env.reset(seed=seed)
    seen = [env.last_root["blue", "observation"].clone()]
    for t in range(steps):
        nxt = env.step(actions(env, [[t % 3, 2]] * env.num_envs, [[0.5, -0.5]] * env.num_envs))
        seen += [nxt["blue", "observation"].clone(), env.last_root["blue", "observation"].clone()]
    return seen


def second_draw(seed: int) -> float:
    rng = np.random.default_rng(seed)
    rng.integers(1000)
    return float(rng.integers(1000))


def test_a_seed_seeds_copy_i_with_seed_plus_i_and_later_resets_go_on_unseeded() -> None:
    make = functools.partial(PettingZooEnv, functools.partial(TeamEnv, episode_length=2), num_envs=3)
    with make() as a, make() as b:
        first = a.reset(seed=7)["blue", "observation"][:, 0, 1].tolist()
        assert first == [float(np.random.default_rng(7 + i).integers(1000)) for i in range(3)]
        one, two = rollout(a, 7, 6), rollout(b, 7, 6)
        assert all(torch.equal(x, y) for x, y in zip(one, two, strict=True))
        offsets = [x[:, 0, 1].tolist() for x in one[::4]]  # a new episode every other step, two tensors per step
        assert len({tuple(o) for o in offsets}) == len(offsets)  # each reset drew a new offset
        assert offsets[1] == [second_draw(7 + i) for i in range(3)]
        assert rollout(a, 8, 6)[0][:, 0, 1].tolist() != first


def test_dict_observations_become_nested_keys_and_the_action_mask_sits_beside_them() -> None:
    with PettingZooEnv(MaskedTeamEnv) as env:
        assert ("red", "observation", "pos") in env.observation_spec.leaf_keys()
        assert ("red", "action_mask") in env.observation_spec.leaf_keys()
        root = env.reset(seed=0)
        assert root["red", "action_mask"].dtype == torch.bool
        assert root["red", "action_mask"].tolist() == [[[True, True, False]] * 2]
        assert root["red", "observation", "pos"][0, :, 0].tolist() == [0.0, 0.0]
        assert env.step(actions(env, [[1, 1]], [[0.0, 0.0]]))["red", "observation", "pos"][0, :, 0].tolist() == [
            1.0,
            1.0,
        ]


def test_close_closes_every_copy() -> None:
    env = PettingZooEnv(TeamEnv, num_envs=3)
    copies = env.envs
    env.close()
    assert [c.closed for c in copies] + [env.is_closed] == [True] * 4


def test_a_missing_action_says_which_key_it_wanted() -> None:
    with PettingZooEnv(TeamEnv) as env:
        env.reset()
        only_red = TensorDict({"red": {"action": torch.zeros(1, 2, dtype=torch.int64)}}, batch_size=[1])
        with pytest.raises(PolicyError, match=r"\('blue', 'action'\)"):
            env.step_and_reset_into(only_red, env.make_next(), env.make_root())


# -- refused configurations --------------------------------------------------------------------------------------
def test_an_aec_env_is_refused_with_the_parallel_spelling() -> None:
    with pytest.raises(ConfigurationError, match="aec_to_parallel"):
        PettingZooEnv(simple_spread_v3.env)


@pytest.mark.parametrize(("env_fn", "says"), [(TeamEnv(), "callable"), (DictActionEnv, "flat action")])
def test_an_env_instance_and_a_dict_action_space_are_refused(env_fn, says) -> None:
    with pytest.raises(ConfigurationError, match=says):
        PettingZooEnv(env_fn)


def test_a_group_of_agents_with_different_spaces_is_refused_with_a_group_map_that_fits() -> None:
    made: list[TeamEnv] = []

    def make() -> TeamEnv:
        made.append(TeamEnv())
        return made[-1]

    with pytest.raises(ConfigurationError, match=r"observation space.*separate groups") as info:
        PettingZooEnv(make, num_envs=2, group_map={"all": ["red_0", "red_1", "blue_0"]})
    assert "'all_other': ['blue_0']" in str(info.value)
    assert [env.closed for env in made] == [True, True]  # what was built is closed
    tag = functools.partial(simple_tag_v3.parallel_env, max_cycles=5)
    with pytest.raises(ConfigurationError, match="separate groups"):
        PettingZooEnv(tag, group_map={"x": ["adversary_0", "agent_0"], "y": ["adversary_1", "adversary_2"]})


@pytest.mark.parametrize(
    "group_map", [{"red": ["red_0"], "blue": ["blue_0"]}, {"red": ["red_0", "red_1", "red_1"], "blue": ["blue_0"]},
                  {"red": "red_0", "blue": ["blue_0", "red_1"]}, {"done": ["red_0", "red_1"], "blue": ["blue_0"]}],
)  # fmt: skip
def test_a_group_map_that_does_not_fit_the_agents_is_refused(group_map) -> None:
    with pytest.raises(ConfigurationError, match="group_map"):
        PettingZooEnv(TeamEnv, group_map=group_map)


def test_a_given_group_map_overrides_the_prefixes() -> None:
    with PettingZooEnv(TeamEnv, group_map={"a": ["red_1"], "b": ["red_0"], "c": ["blue_0"]}) as env:
        env.reset(seed=0)
        action = {"a": torch.tensor([[2]]), "b": torch.tensor([[1]]), "c": torch.zeros(1, 1, 2)}
        nxt = env.step(TensorDict({g: {"action": v} for g, v in action.items()}, batch_size=[1]))
        assert col(nxt, "a", "reward") == [[12.0]]
        assert col(nxt, "b", "reward") == [[1.0]]


# -- mpe2 ---------------------------------------------------------------------------------------------------------
def test_simple_spread_matches_the_raw_env_step_by_step() -> None:
    make = functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=4)
    raw = make()
    with PettingZooEnv(make, num_envs=1) as env:
        root = env.reset(seed=3)
        obs, _ = raw.reset(seed=3)
        agents = raw.possible_agents
        assert torch.equal(root["agent", "observation"][0], torch.tensor(np.stack([obs[a] for a in agents])))
        for t in range(4):
            act = [(t + j) % 5 for j in range(3)]
            nxt = env.step(TensorDict({"agent": {"action": torch.tensor([act])}}, batch_size=[1]))
            obs, rew, _, trunc, _ = raw.step(dict(zip(agents, act, strict=True)))
            assert torch.equal(nxt["agent", "observation"][0], torch.tensor(np.stack([obs[a] for a in agents])))
            assert nxt["agent", "reward"][0, :, 0].tolist() == pytest.approx([rew[a] for a in agents])
            assert col(nxt, "agent", "truncated") == [[trunc[a] for a in agents]]
        assert col(nxt, "truncated") == [True]
        assert col(nxt, "terminated") == [False]
        assert env.last_root["agent", "observation"][0, 0].tolist() != nxt["agent", "observation"][0, 0].tolist()
    raw.close()


def test_simple_tag_has_two_groups_and_continuous_actions_are_bounded() -> None:
    make = functools.partial(simple_tag_v3.parallel_env, max_cycles=3, continuous_actions=True)
    with PettingZooEnv(make, num_envs=2) as env:
        assert env.group_map == {"adversary": ["adversary_0", "adversary_1", "adversary_2"], "agent": ["agent_0"]}
        spec = env.action_spec["adversary", "action"]
        assert isinstance(spec, Bounded)
        assert spec.shape == (3, 5)
        assert spec.low.min() == 0
        assert spec.high.max() == 1
        env.reset(seed=0)
        for _ in range(3):
            nxt = env.step(env.action_spec.rand((2,)))
        assert col(nxt, "done") == [True, True]
        assert nxt["agent", "observation"].shape == (2, 1, 14)


@pytest.mark.filterwarnings("ignore:PettingZoo in TorchRL is tested")
@pytest.mark.torchrl
def test_the_keys_shapes_and_dtypes_match_torchrls_wrapper() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import PettingZooWrapper

    make = functools.partial(simple_tag_v3.parallel_env, max_cycles=3)
    theirs = PettingZooWrapper(make(), use_mask=True)
    with PettingZooEnv(make) as ours:
        assert ours.group_map == theirs.group_map
        their_td = theirs.rollout(2, break_when_any_done=False)  # [T, ...]
        ours.reset(seed=0)
        our_td = ours.step(ours.action_spec.rand((1,)))
        group_keys = sorted(k for k in our_td.keys(True, True) if isinstance(k, tuple))
        assert group_keys == sorted(k[1:] for k in their_td.keys(True, True) if k[0] == "next" and len(k) == 3)
        for key in group_keys:
            mine, theirs_leaf = our_td.get(key), their_td.get(("next", *key))
            assert mine.shape[1:] == theirs_leaf.shape[1:], key
            assert mine.dtype == theirs_leaf.dtype, key
        for key in ours.action_keys:
            assert ours.action_spec[key].shape == theirs.full_action_spec[key].shape, key
            assert ours.action_spec[key].dtype == theirs.full_action_spec[key].dtype, key
    theirs.close()


# -- collectors ---------------------------------------------------------------------------------------------------
# Pickled by reference to acollect and mpe2 only: a worker process builds it without importing this module.
spread = functools.partial(PettingZooEnv, functools.partial(simple_spread_v3.parallel_env, N=2, max_cycles=5), 2)


def check_spread_batch(batch: TensorDict) -> None:
    assert batch["agent", "action"].shape[-1] == 2
    assert batch["next", "agent", "reward"].shape[-2:] == (2, 1)
    # Episodes of 5 steps from a reset: truncated at the 5th step of each, and nowhere else.
    steps = batch["next", "agent", "observation"].shape[-3]
    truncated = batch["next", "truncated"].reshape(-1, steps)
    assert truncated.sum(-1).tolist() == [steps // 5] * truncated.shape[0]
    # simple_spread's reward is shared: every agent of a copy gets the same one.
    reward = batch["next", "agent", "reward"]
    assert torch.equal(reward[..., 0, :], reward[..., 1, :])


async def test_collector_collects_group_keys() -> None:
    from acollect import Collector

    async with Collector(spread, None, frames_per_batch=20, total_frames=40) as collector:
        async for batch in collector:
            assert batch.shape == (2, 10)
            check_spread_batch(batch)


async def test_collector_routes_each_agents_action_and_masks_agents_that_left() -> None:
    from acollect import Collector

    async with Collector(functools.partial(PettingZooEnv, TeamEnv, 2), None, frames_per_batch=16) as collector:
        batch = await anext(collector)
    assert batch.shape == (2, 8)
    alive = batch["red", "mask"]  # live when the step started: its action reached the env
    reward, action = batch["next", "red", "reward"].squeeze(-1), batch["red", "action"].float()
    assert torch.equal(reward[alive], (action + torch.tensor([0.0, 10.0]))[alive])
    assert (reward[~alive] == 0).all()
    assert alive[..., 1].tolist() == [[True, True, False, False] * 2] * 2  # red_1 leaves at step 2 of 4
    assert batch["next", "done"].squeeze(-1).tolist() == [[False, False, False, True] * 2] * 2


async def test_multi_sync_collector_with_two_workers_collects_group_keys() -> None:
    from acollect import MultiSyncCollector

    with anyio.fail_after(120):
        async with MultiSyncCollector([spread] * 2, None, frames_per_batch=40, total_frames=40) as collector:
            async for batch in collector:
                check_spread_batch(batch)
