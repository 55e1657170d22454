"""A copy of a ``PettingZooEnv`` that raises is rebuilt alone (``env_errors="restart"``): its episode ends truncated
where the fault was (at the root and in every group), its neighbours' episodes go on step after step, and a seeded
run with the same faults repeats exactly."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import anyio
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from acollect import Collector, MultiSyncCollector
from acollect._rollout.build import build_engine
from acollect._rollout.spec import RolloutSpec
from acollect.envs import PettingZooEnv
from acollect.envs._gym_faults import rebuild_seed
from acollect.errors import PolicyError

pettingzoo = pytest.importorskip("pettingzoo")

N_COPIES, FAULTY, CRASH_AT, EPISODE = 3, 1, 7, 5
GROUPS = ("team", "solo")


class CountingTeam(pettingzoo.ParallelEnv):
    """Agents ``team_0``, ``team_1`` and ``solo``; each sees ``[t, start]``: the episode's step count, and a start
    value drawn from the env's ``np_random`` at each reset. Every agent terminates at step ``EPISODE``.

    ``crash_at``: the step of its life (counted over its episodes) at which ``step`` raises; ``reset_fails``: the
    reset after its first episode ended raises. An action outside its space is refused.
    """

    metadata: ClassVar[dict[str, str]] = {"name": "counting_team_v0"}

    def __init__(self, crash_at: int | None = None, reset_fails: bool = False) -> None:
        self.possible_agents = ["team_0", "team_1", "solo"]
        self.agents: list[str] = []
        self.crash_at, self.reset_fails = crash_at, reset_fails
        self.np_random = np.random.default_rng()
        self.life, self.t, self.start = 0, 0, 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        if self.reset_fails and self.t == EPISODE:
            self.reset_fails = False  # once in its life
            raise ConnectionError("the simulator dropped the reset")
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.start, self.t = int(self.np_random.integers(1000)), 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.array([self.t, self.start], np.float32) for a in self.agents}

    def step(self, actions: dict[str, int]) -> Any:
        for agent, act in actions.items():
            if not self.action_space(agent).contains(act):
                raise ValueError(f"{agent} got action {act}")
        self.life += 1
        if self.life == self.crash_at:
            raise RuntimeError(f"the copy starting at {self.start} fell over")
        self.t += 1
        obs, ended = self._obs(), self.t >= EPISODE
        rewards = {a: float(actions[a]) for a in self.agents}
        terms, truncs = dict.fromkeys(self.agents, ended), dict.fromkeys(self.agents, False)
        infos = {a: {} for a in self.agents}
        if ended:
            self.agents = []
        return obs, rewards, terms, truncs, infos


class Copies:
    """``env_fn`` of a ``PettingZooEnv``: its ``faulty``-th copy, and every copy built after the first
    ``n_copies`` (a rebuild of the faulty one), raise as ``CountingTeam(**faults)`` says; the others do not."""

    def __init__(self, n_copies: int = N_COPIES, faulty: int = FAULTY, **faults: Any) -> None:
        self.n_copies, self.faulty, self.faults, self.built = n_copies, faulty, faults, 0

    def __call__(self) -> CountingTeam:
        k, self.built = self.built, self.built + 1
        return CountingTeam(**self.faults) if k == self.faulty or k >= self.n_copies else CountingTeam()


def teams() -> PettingZooEnv:
    """``N_COPIES`` copies, of which copy ``FAULTY`` raises at the ``CRASH_AT``-th step of each of its lives."""
    return PettingZooEnv(Copies(crash_at=CRASH_AT), N_COPIES)


def _engine(create_env_fn: Any = teams, frames: int = 10, seed: int = 0) -> Any:
    spec = RolloutSpec(create_env_fn=create_env_fn, frames_per_batch=N_COPIES * frames, env_errors="restart")
    engine = build_engine(spec, blocking=True)
    engine.seed(seed)
    return engine


def _obs(batch: TensorDictBase, *key: str) -> torch.Tensor:
    """``key``'s observation of agent ``team_0``: ``[..., (t, start)]``."""
    return batch.get((*key, "team", "observation"))[..., 0, :]


def _assert_continuous(row: TensorDictBase, *, cut: bool = False) -> None:
    """One copy's frames ``[T]``: real steps, each from where the last left, a new episode only after one ended
    (terminated at step ``EPISODE``), one trajectory id per episode, and never truncated (``cut``: at the last frame
    only, in every group)."""
    obs, nxt = _obs(row), _obs(row, "next")
    terminated = row["next", "terminated"].squeeze(-1)
    ids = row["collector", "traj_ids"]
    assert torch.equal(nxt[:, 0], obs[:, 0] + 1)  # a step of this episode
    assert torch.equal(nxt[:, 1], obs[:, 1])
    assert terminated.tolist() == (nxt[:, 0] == EPISODE).tolist()
    for t in range(row.shape[0] - 1):
        if terminated[t]:
            assert obs[t + 1, 0] == 0
            assert ids[t + 1] != ids[t]
        else:
            assert torch.equal(obs[t + 1], nxt[t])
            assert ids[t + 1] == ids[t]
    for group in GROUPS:
        assert torch.equal(row["next", group, "terminated"].squeeze(-1).any(-1), terminated)
    truncated = [False] * (row.shape[0] - 1) + [cut]
    assert row["next", "truncated"].squeeze(-1).tolist() == truncated
    for group in GROUPS:
        assert row["next", group, "truncated"].squeeze(-1).all(-1).tolist() == truncated
        assert not (row["next", group, "truncated"].squeeze(-1).any(-1) & ~torch.tensor(truncated)).any()


def _check_neighbours(batch: TensorDictBase, faulty: int = FAULTY) -> None:
    for i in range(batch.shape[0]):
        if i != faulty:
            _assert_continuous(batch[i])


def test_the_copy_that_raised_is_rebuilt_alone_and_the_others_step_on() -> None:
    engine = _engine()
    try:
        copies = engine.env.envs
        batch = engine.collect()
        assert engine.env_restarts == 1
        after = engine.env.envs
        assert [a is b for a, b in zip(copies, after, strict=True)] == [True, False, True]
    finally:
        engine.close()
    _check_neighbours(batch)
    row = batch[FAULTY]
    # Its life's steps 1-5 are frames 0-4 (an episode, terminated), step 6 is frame 5, step 7 raised: frame 6 is the
    # rebuilt copy's first step, from its first observation, seeded from its own sequence.
    _assert_continuous(row[:6], cut=True)
    _assert_continuous(row[6:])
    start = int(np.random.default_rng(rebuild_seed(0, FAULTY, 1)).integers(1000))
    assert _obs(row)[6].tolist() == [0.0, start]
    assert _obs(row, "next")[6].tolist() == [1.0, start]
    # The episode in flight ends where it was (frame 5), truncated at the root and in every group.
    assert row["next", "done"].squeeze(-1)[5]
    assert not row["next", "terminated"].squeeze(-1)[5]
    for group in GROUPS:
        assert row["next", group, "done"].squeeze(-1)[5].all()
    assert row["team", "mask"][6].all()  # the rebuilt copy's agents are all in its first episode
    ids = batch["collector", "traj_ids"]
    assert ids[FAULTY, 6] > ids[:, :6].max()  # a new trajectory, never seen before
    assert (ids[FAULTY, 6:] == ids[FAULTY, 6]).all()


def test_the_warning_names_the_copy_and_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine()
    try:
        with caplog.at_level(logging.WARNING, logger="acollect"):
            engine.collect()
    finally:
        engine.close()
    message = next(r.getMessage() for r in caplog.records if "raised" in r.getMessage())
    assert message.startswith(f"sub-env {FAULTY} raised RuntimeError: the copy starting at ")
    assert "rebuilding it alone" in message


def test_a_reset_that_fails_after_an_episode_ended_keeps_the_step_and_rebuilds_the_copy() -> None:
    engine = _engine(lambda: PettingZooEnv(Copies(reset_fails=True), N_COPIES), frames=8)
    try:
        batch = engine.collect()
        assert engine.env_restarts == 1
    finally:
        engine.close()
    _check_neighbours(batch)
    row = batch[FAULTY]
    _assert_continuous(row[:5])
    assert row["next", "terminated"].squeeze(-1)[4]  # its episode ended by itself: nothing cut
    assert not row["next", "truncated"].any()
    start = int(np.random.default_rng(rebuild_seed(0, FAULTY, 1)).integers(1000))
    assert _obs(row)[5].tolist() == [0.0, start]  # the rebuilt copy's first observation
    _assert_continuous(row[5:])


def test_an_action_outside_its_space_is_the_policys_fault_and_is_raised() -> None:
    handled: list[int] = []
    with PettingZooEnv(CountingTeam, N_COPIES) as env:
        assert env.contain_faults(lambda i, *_: handled.append(i))
        env.reset(seed=0)
        action = env.action_spec.zero((N_COPIES,))
        action["team", "action"][FAULTY, 1] = 7
        with pytest.raises(PolicyError, match=r"action 7 for agent 'team_1' \(copy 1\) is outside"):
            env.step(action)
    assert handled == []


def test_a_copy_raising_without_containment_raises_out_of_the_step() -> None:
    with PettingZooEnv(Copies(crash_at=1), N_COPIES) as env:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="fell over"):
            env.step(env.action_spec.zero((N_COPIES,)))


async def test_the_in_process_collector_rebuilds_one_copy_and_counts_it() -> None:
    async with Collector(
        teams, None, frames_per_batch=N_COPIES * 10, total_frames=N_COPIES * 30, env_errors="restart"
    ) as collector:
        batches = [b.clone() async for b in collector]
        stats = collector.stats()
    assert stats.env_restarts == 4  # lives of 6 good steps: faults at steps 7, 13, 19, 25 of 30
    _check_neighbours(torch.cat(batches, dim=1))  # across batch boundaries too


async def test_workers_rebuild_one_copy_and_the_others_go_on() -> None:
    with anyio.fail_after(120):
        async with MultiSyncCollector(
            [teams, teams], None, frames_per_batch=2 * N_COPIES * 10, total_frames=2 * N_COPIES * 30,
            env_errors="restart", start_method="forkserver",
        ) as collector:  # fmt: skip
            batches = [b.clone() async for b in collector]
            stats = collector.stats()
    assert stats.env_restarts == 8
    whole = torch.cat(batches, dim=-1)
    for worker in range(2):
        _check_neighbours(whole[worker])


async def test_a_seeded_run_with_the_same_faults_repeats_exactly() -> None:
    async def run(seed: int) -> TensorDictBase:
        async with Collector(
            teams, None, frames_per_batch=N_COPIES * 10, total_frames=N_COPIES * 30, env_errors="restart"
        ) as collector:
            collector.set_seed(seed)
            batches = [b.clone() async for b in collector]
            assert collector.stats().env_restarts == 4
        return torch.cat(batches, dim=1)

    first, again, other = await run(3), await run(3), await run(4)
    assert (first == again).all()
    assert not torch.equal(_obs(first), _obs(other))
    # Each rebuilt copy's first start comes from its own seed, not from one fixed state.
    row = first[FAULTY]
    rebuilt = _obs(row)[row["next", "truncated"].squeeze(-1).roll(1)]
    assert len(rebuilt) == 4
    assert len(set(rebuilt[:, 1].tolist())) == 4


def test_a_seeded_full_reset_restarts_the_rebuilds_sequence() -> None:
    # Rebuild k of copy i after reset_into(seed=s) is seeded rebuild_seed(s, i, k), whatever came before s.
    seen: list[int] = []

    def handler(i: int, error: Exception, restart: Any, ended: bool) -> None:
        restart(first)
        seen.append(int(first["team", "observation"][i, 0, 1]))

    with PettingZooEnv(CountingTeam, N_COPIES) as env:
        first = env.make_root()
        assert env.contain_faults(handler)
        for seed in (5, 5):
            env.reset(seed=seed)
            env.envs[FAULTY].crash_at = env.envs[FAULTY].life + 1  # its next step raises (a rebuilt copy's never)
            nxt = env.step(env.action_spec.zero((N_COPIES,)))
            assert nxt["team", "observation"][FAULTY, 0].tolist() == [1.0, seen[-1]]
    expected = int(np.random.default_rng(rebuild_seed(5, FAULTY, 1)).integers(1000))
    assert seen == [expected, expected]
