"""The rollout engine on its own: CountingEnv and gymnasium envs driven by RolloutEngine, no collector.

Counting envs make every check exact: an observation is its sub-env's step count plus ``RESET_JUMP``
per reset, so gaps, repeats, misplaced done flags and transitions that did not happen all show.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from tensordict import TensorDict, TensorDictBase

from acollect._batches.plan import BatchPlan
from acollect._devices import resolve_devices
from acollect._policy import wrap_policy
from acollect._rollout.blocking import RolloutEngine, RolloutInterrupted
from acollect._rollout.spec import RolloutSpec
from acollect._rollout.trajectories import Trajectories
from acollect.envs import EnvBase, GymEnv
from acollect.errors import ConfigurationError, PolicyError
from acollect.testing import (
    ENV_STRIDE,
    RESET_JUMP,
    CountingEnv,
    CountingGymEnv,
    SplitProbe,
    WeightProbe,
    assert_counting_batch,
)

ROOT_KEYS = {"observation", "action", "done", "terminated", "truncated"}
NEXT_KEYS = {("next", k) for k in ("observation", "reward", "done", "terminated", "truncated")}
COLLECTOR_KEYS = {("collector", "traj_ids"), ("collector", "policy_version")}


@pytest.fixture
def make_engine() -> Iterator[Callable[..., RolloutEngine]]:
    """Builds engines the way collectors do (``wrap_policy``, ``resolve_devices``) and closes them after the test."""
    engines: list[RolloutEngine] = []

    def make(env: EnvBase, policy: Any = None, *, frames_per_batch: int, **kwargs: Any) -> RolloutEngine:
        adapter = wrap_policy(
            policy,
            observation_keys=env.observation_spec.leaf_keys(),
            action_spec=env.action_spec,
            batch_size=env.batch_size,
        )
        devices = resolve_devices(env_default=env.device, policy=policy)
        # As the engine builder does: the steps of each env are the plan's, asked once the env says its size.
        time_steps = BatchPlan(frames_per_batch).time_steps(env.num_envs)
        spec = RolloutSpec(create_env_fn=env, frames_per_batch=frames_per_batch, **kwargs)
        engine = RolloutEngine(env, adapter, time_steps=time_steps, devices=devices, spec=spec)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def obs(batch: TensorDictBase, *key: str) -> list[list[float]]:
    """The counting observations of a batch (``("next",)`` for the next ones), ``[n_envs][T]``."""
    return batch.get((*key, "observation"))[..., 0].tolist()


def flag(batch: TensorDictBase, *key: str) -> list[list[bool]]:
    return batch.get(key)[..., 0].tolist()


def keys_of(batch: TensorDictBase) -> set[Any]:
    return {k if isinstance(k, str) else tuple(k) for k in batch.keys(include_nested=True, leaves_only=True)}


# -- layout ----------------------------------------------------------------------------------------


def test_batch_layout_keys_dtypes_and_shapes(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=3), WeightProbe(0.0), frames_per_batch=10)
    assert engine.frames_per_batch == 3 * BatchPlan(10).time_steps(3) == 12  # rounded up to a multiple of n_envs
    assert engine.time_steps == 4
    batch = engine.collect()
    assert batch.batch_size == torch.Size([3, 4])
    assert batch.names == [None, "time"]
    assert keys_of(batch) == ROOT_KEYS | NEXT_KEYS | COLLECTOR_KEYS
    for key in ("observation", "done", "terminated", "truncated", ("next", "reward"), ("next", "done")):
        assert batch.get(key).shape == (3, 4, 1), key
    assert batch["action"].shape == (3, 4)
    assert batch["action"].dtype == torch.int64
    assert batch["next", "reward"].dtype == torch.float32
    for key in ("done", "terminated", "truncated"):
        assert batch.get(key).dtype == torch.bool
        assert batch.get(("next", key)).dtype == torch.bool
    assert batch["collector", "traj_ids"].dtype == torch.int64
    assert batch["collector", "policy_version"].shape == (3, 4)


def test_every_policy_output_gets_a_column(make_engine: Callable[..., RolloutEngine]) -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        n = td.batch_size[0]
        return td.set("action", torch.ones(n, dtype=torch.int64)).set("log_prob", torch.full((n, 2), -0.5))

    engine = make_engine(CountingEnv(num_envs=2), policy, frames_per_batch=6)
    batch = engine.collect()
    assert keys_of(batch) == ROOT_KEYS | {"log_prob"} | NEXT_KEYS | COLLECTOR_KEYS
    assert batch["log_prob"].shape == (2, 3, 2)
    assert bool((batch["log_prob"] == -0.5).all())
    assert bool((batch["action"] == 1).all())


def test_collect_fills_the_given_buffers(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=2), frames_per_batch=6)
    out = engine.allocate()
    assert keys_of(out) == keys_of(engine.collect())
    assert engine.collect(out=out) is out
    assert_counting_batch(out)


def test_a_policy_without_an_action_is_refused_at_construction(make_engine: Callable[..., RolloutEngine]) -> None:
    with pytest.raises(PolicyError, match="did not write 'action'"):
        make_engine(CountingEnv(num_envs=2), lambda td: td.set("other", torch.zeros(2)), frames_per_batch=4)
    with pytest.raises(PolicyError, match="expected \\(2,\\)"):
        make_engine(CountingEnv(num_envs=2), lambda td: td.set("action", torch.zeros(2, 3)), frames_per_batch=4)


# -- steps, episodes, trajectories ------------------------------------------------------------------


def test_between_steps_is_called_before_every_step(make_engine: Callable[..., RolloutEngine]) -> None:
    # The in-process collector offers the GIL to the event loop there: once per step, never inside one.
    engine = make_engine(CountingEnv(num_envs=2), frames_per_batch=10)  # 5 steps
    seen: list[float] = []
    env = engine.env
    assert isinstance(env, CountingEnv)
    engine.collect(between_steps=lambda: seen.append(env.step_count))
    assert seen == [0, 1, 2, 3, 4]  # before step t, t steps were taken


def test_steps_are_contiguous_per_env_within_and_across_batches(make_engine: Callable[..., RolloutEngine]) -> None:
    env = CountingEnv(num_envs=2, episode_length=[3, 5])
    engine = make_engine(env, WeightProbe(0.0), frames_per_batch=8)
    batches = [engine.collect() for _ in range(3)]
    # The policy probe's reset is not collected: the first batch starts at the collection's own reset.
    assert [row[0] for row in obs(batches[0])] == [RESET_JUMP, ENV_STRIDE + RESET_JUMP]
    for batch in batches:
        assert_counting_batch(batch)
    assert_counting_batch(torch.cat(batches, dim=1))  # nothing lost or repeated at batch boundaries
    assert env.steps_taken.tolist() == [12, 12]
    assert engine.steps == 12
    assert engine.frames == 24


def test_done_flags_sit_on_the_last_step_of_an_episode(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=1, episode_length=3), frames_per_batch=7)
    batch = engine.collect()
    j = RESET_JUMP
    assert obs(batch) == [[j, j + 1, j + 2, 2 * j + 3, 2 * j + 4, 2 * j + 5, 3 * j + 6]]
    # ("next", ...) holds the true final observation, never the next episode's first one.
    assert obs(batch, "next") == [[j + 1, j + 2, j + 3, 2 * j + 4, 2 * j + 5, 2 * j + 6, 3 * j + 7]]
    ends = [[False, False, True, False, False, True, False]]
    assert flag(batch, "next", "done") == ends
    assert flag(batch, "next", "terminated") == ends
    assert flag(batch, "next", "truncated") == [[False] * 7]
    # Root flags are the state before each step: a finished env was reset in the same step.
    for key in ("done", "terminated", "truncated"):
        assert flag(batch, key) == [[False] * 7]
    assert batch["next", "reward"].sum().item() == 7.0


def test_traj_ids_are_new_after_each_episode_end_and_continue_across_batches(
    make_engine: Callable[..., RolloutEngine],
) -> None:
    engine = make_engine(CountingEnv(num_envs=2, episode_length=[3, 5]), frames_per_batch=8)
    batches = [engine.collect() for _ in range(3)]
    ids = torch.cat([b["collector", "traj_ids"] for b in batches], dim=1)  # [2, 12]
    done = torch.cat([b["next", "done"][..., 0] for b in batches], dim=1)
    changed = ids[:, 1:] != ids[:, :-1]
    assert torch.equal(changed, done[:, :-1])  # a new id exactly after each end, batch boundaries included
    assert bool((ids[:, 1:] >= ids[:, :-1]).all())
    first, second = set(ids[0].tolist()), set(ids[1].tolist())
    assert not first & second  # unique across sub-envs
    # Every id handed out was used: the initial reset's two, then one per episode end but the last ones'.
    assert first | second == set(range(engine.next_traj_counter - int(done[:, -1].sum())))


def test_traj_id_offset_and_stride_keep_workers_apart(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(
        CountingEnv(num_envs=2, episode_length=2), frames_per_batch=8, traj_id_offset=1, traj_id_stride=3
    )
    ids = engine.collect()["collector", "traj_ids"]
    assert ids[:, 0].tolist() == [1, 4]
    assert all(i % 3 == 1 for i in ids.unique().tolist())


def test_max_frames_per_traj_truncates_and_resets_across_batches(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=2, episode_length=100), frames_per_batch=12, max_frames_per_traj=4)
    first, second = engine.collect(), engine.collect()  # T = 6
    assert flag(first, "next", "truncated") == [[False, False, False, True, False, False]] * 2
    # The trajectory that started at t=4 of the first batch reaches 4 steps at t=1 of the second.
    assert flag(second, "next", "truncated") == [[False, True, False, False, False, True]] * 2
    for batch in (first, second):
        assert torch.equal(batch["next", "done"], batch["next", "truncated"])
        assert not bool(batch["next", "terminated"].any())
    both = torch.cat([first, second], dim=1)
    assert_counting_batch(both)  # after a truncation the env was really reset (+RESET_JUMP)
    ids = both["collector", "traj_ids"]
    assert [len(set(row.tolist())) for row in ids] == [3, 3]  # one from the reset, two after truncations


def test_a_trajectory_reaches_its_limit_with_exactly_its_last_step() -> None:
    trajectories = Trajectories(2, offset=0, stride=1, max_length=3)
    reached = [trajectories.count_step().tolist() for _ in range(3)]
    assert reached == [[False, False], [False, False], [True, True]]  # the 3rd step ends a 3-step trajectory
    assert trajectories.lengths.tolist() == [3, 3]
    trajectories.lengths[0] = 0  # env 0 begins a new trajectory
    assert [bool(trajectories.count_step(0)) for _ in range(3)] == [False, False, True]  # one env alone: the same
    assert trajectories.lengths.tolist() == [3, 3]  # env 1's untouched
    assert Trajectories(1, offset=0, stride=1, max_length=1).count_step().tolist() == [True]
    unlimited = Trajectories(2, offset=0, stride=1)
    assert not any(unlimited.count_step().any() for _ in range(5))
    assert unlimited.lengths.tolist() == [5, 5]


def test_init_random_frames_then_the_policy(make_engine: Callable[..., RolloutEngine]) -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        n = td.batch_size[0]
        return td.set("action", torch.ones(n, dtype=torch.int64)).set("from_policy", torch.ones(n))

    # 4 envs, 16 frames a batch (T = 4): frames 0 and 4 of the first batch are random, 8 on the policy's.
    engine = make_engine(CountingEnv(num_envs=4), policy, frames_per_batch=16, init_random_frames=8)
    engine.seed(0)
    first, second = engine.collect(), engine.collect()
    # The random policy writes only "action": the policy's other outputs are zero on random steps.
    assert first["from_policy"][0].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert bool((first["action"][:, 2:] == 1).all())
    assert not bool((first["action"][:, :2] == 1).all())  # 8 random actions, seeded: not all ones
    assert bool((second["from_policy"] == 1).all())


def test_reset_at_each_iter_starts_every_batch_afresh(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=2, episode_length=100), frames_per_batch=6, reset_at_each_iter=True)
    first, second = engine.collect(), engine.collect()
    last = [row[-1] for row in obs(first, "next")]
    assert [row[0] for row in obs(second)] == [x + RESET_JUMP for x in last]  # reset, not continued
    assert not set(first["collector", "traj_ids"].unique().tolist()) & set(
        second["collector", "traj_ids"].unique().tolist()
    )


def test_without_reset_at_each_iter_batches_continue(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=2, episode_length=100), frames_per_batch=6)
    first, second = engine.collect(), engine.collect()
    assert [row[0] for row in obs(second)] == [row[-1] for row in obs(first, "next")]
    assert torch.equal(second["collector", "traj_ids"][:, 0], first["collector", "traj_ids"][:, -1])


def test_seed_makes_the_next_batch_start_from_a_fresh_reset(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=1, episode_length=100), frames_per_batch=3)
    first = engine.collect()
    engine.seed(7)
    second = engine.collect()
    assert obs(second)[0][0] == obs(first, "next")[0][-1] + RESET_JUMP
    assert second["collector", "traj_ids"][0, 0] != first["collector", "traj_ids"][0, -1]


# -- stopping and versions ---------------------------------------------------------------------------


def test_a_set_stop_event_interrupts_before_any_step(make_engine: Callable[..., RolloutEngine]) -> None:
    env = CountingEnv(num_envs=2)
    engine = make_engine(env, frames_per_batch=8)
    stop = threading.Event()
    stop.set()
    with pytest.raises(RolloutInterrupted):
        engine.collect(stop)
    assert env.step_count == 0
    assert engine.frames == 0


def stopped_at_step_3(make_engine: Callable[..., RolloutEngine]) -> tuple[CountingEnv, RolloutEngine, threading.Event]:
    """An engine whose first batch (10 steps of 2 envs) a stop event interrupted after its third step."""
    stop = threading.Event()
    calls = 0

    def policy(td: TensorDictBase) -> TensorDictBase:
        nonlocal calls
        calls += 1
        if calls == 4:  # the probe call, then the third step of the batch
            stop.set()
        return td.set("action", torch.zeros(td.batch_size[0], dtype=torch.int64))

    env = CountingEnv(num_envs=2, episode_length=100)
    engine = make_engine(env, policy, frames_per_batch=20)
    with pytest.raises(RolloutInterrupted):
        engine.collect(stop)
    stop.clear()
    return env, engine, stop


def test_stop_mid_batch_keeps_the_steps_and_the_next_collect_continues(
    make_engine: Callable[..., RolloutEngine],
) -> None:
    env, engine, stop = stopped_at_step_3(make_engine)
    assert engine.steps == env.step_count == 3  # the step in progress finished; no further one began
    assert engine.frames == 0
    assert engine.in_batch
    out = engine.allocate()  # continued in other buffers (a worker's slot): the steps taken come along
    batch = engine.collect(stop, out=out)
    assert batch is out
    assert env.step_count == 10  # 3 steps kept, 7 more: nothing stepped twice or thrown away
    # From the batch's own start (the engine's reset after the probe's), not from the steps after it.
    assert [row[0] for row in obs(batch)] == [RESET_JUMP, ENV_STRIDE + RESET_JUMP]
    assert_counting_batch(batch)
    assert engine.frames == 20
    assert not engine.in_batch
    assert engine.discarded_frames == 0


def test_a_reseed_gives_up_a_held_batch_and_counts_its_frames(make_engine: Callable[..., RolloutEngine]) -> None:
    _, engine, stop = stopped_at_step_3(make_engine)
    engine.seed(7)
    assert not engine.in_batch
    assert engine.discarded_frames == 3 * 2
    batch = engine.collect(stop)
    assert obs(batch)[0][0] == 2 * RESET_JUMP + 3  # a fresh reset, after the 3 steps given up
    assert_counting_batch(batch)


def test_stop_from_another_thread_interrupts_a_slow_batch(make_engine: Callable[..., RolloutEngine]) -> None:
    from acollect.testing import SlowEnv

    engine = make_engine(SlowEnv(0.005, num_envs=1), frames_per_batch=20_000)  # 100 s a batch
    stop = threading.Event()
    timer = threading.Timer(0.05, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(RolloutInterrupted):
            engine.collect(stop)
    finally:
        timer.cancel()
        timer.join()
    assert time.monotonic() - started < 30  # noticed at the next step, not at the end of the batch


def test_split_policy_calls_yield_between_sending_and_taking_each_step(
    make_engine: Callable[..., RolloutEngine],
) -> None:
    policy = SplitProbe(1)
    engine = make_engine(CountingEnv(num_envs=2), policy, frames_per_batch=6)
    assert engine.split_policy_calls() is policy
    calls = policy.calls
    calls.clear()  # the probe's call
    steps = engine.stepper()
    for _ in range(3):
        next(steps)
        assert calls[-1] == "submit", "the caller gets control while the actions are computed"
    with pytest.raises(StopIteration) as finished:
        next(steps)
    assert calls == ["submit", "receive"] * 3
    assert (finished.value.value["action"] == 1).all()


def test_split_policy_calls_refuse_a_policy_whose_calls_do_not_split(
    make_engine: Callable[..., RolloutEngine],
) -> None:
    engine = make_engine(CountingEnv(num_envs=2), WeightProbe(0.0), frames_per_batch=4)
    with pytest.raises(ConfigurationError, match="policy='ModulePolicy' is invalid: expected a policy whose calls"):
        engine.split_policy_calls()
    assert not engine.in_batch
    assert engine.collect().batch_size == (2, 2)  # the engine goes on calling the policy whole


def test_policy_version_is_stamped_on_every_frame(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=2), frames_per_batch=6)
    assert bool((engine.collect()["collector", "policy_version"] == 0).all())
    engine.policy_version = 7
    batch = engine.collect()
    assert bool((batch["collector", "policy_version"] == 7).all())


# -- gymnasium -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_gymnasium_vector_envs_give_no_dummy_transition(
    make_engine: Callable[..., RolloutEngine], mode: AutoresetMode
) -> None:
    # gymnasium's default NEXT_STEP autoreset would add a no-op step (final obs -> reset obs) after every
    # episode end; the counting observations expose it (+RESET_JUMP instead of +1).
    vec = SyncVectorEnv(CountingGymEnv.env_fns(3, episode_length=3), autoreset_mode=mode)
    engine = make_engine(GymEnv(vec), frames_per_batch=3 * 8)
    batches = [engine.collect() for _ in range(3)]
    for batch in batches:
        assert_counting_batch(batch)
    both = torch.cat(batches, dim=1)
    assert_counting_batch(both)
    assert int(both["next", "done"].sum()) == 3 * 24 // 3  # one end every 3 steps, none lost or doubled


def test_gymnasium_cartpole_layout_and_flags(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(GymEnv("CartPole-v1", num_envs=2), frames_per_batch=200)
    engine.seed(0)
    batch = engine.collect()
    assert batch.batch_size == (2, 100)
    assert batch["observation"].shape == (2, 100, 4)
    assert batch["next", "observation"].dtype == torch.float32
    assert torch.equal(batch["next", "done"], batch["next", "terminated"] | batch["next", "truncated"])
    assert bool(batch["next", "done"].any())  # random actions drop the pole within 100 steps
    # Within an episode the next step starts where the previous one ended.
    same = ~batch["next", "done"][:, :-1, 0]
    assert torch.equal(batch["observation"][:, 1:][same], batch["next", "observation"][:, :-1][same])


def test_batches_are_owned_by_the_caller(make_engine: Callable[..., RolloutEngine]) -> None:
    engine = make_engine(CountingEnv(num_envs=1, episode_length=100), frames_per_batch=2)
    first = engine.collect()
    snapshot = first.clone()
    engine.collect()
    assert isinstance(first, TensorDict)
    assert (first == snapshot).all()  # a second batch does not overwrite the first


def test_a_batch_leaves_the_garbage_collector_nothing_per_step(make_engine: Callable[..., RolloutEngine]) -> None:
    # Objects made per step and kept for the batch (say one view per step and key) are promoted from
    # generation to generation while the batch fills, and bring on full collections of the whole heap.
    env = CountingEnv(num_envs=2)
    tracked: list[int] = []

    def policy(td: TensorDictBase) -> TensorDictBase:
        tracked.append(gc.get_count()[0])  # objects the collector tracks, net of those freed
        return td.set("action", env.action_spec.zero(env.batch_size))

    engine = make_engine(env, policy, frames_per_batch=2 * 1000)
    engine.collect()
    gc.collect()
    gc.disable()
    try:
        tracked.clear()
        before = gc.get_count()[0]
        engine.collect()
    finally:
        gc.enable()
    assert len(tracked) == 1000
    kept = tracked[-1] - before
    assert kept < 1000, f"{kept} objects tracked by the garbage collector are kept while a batch of 1000 steps fills"
