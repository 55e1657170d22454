"""MultiSyncCollector with real worker processes: layout, trajectory ids, weights, seeds, state, validity."""

from __future__ import annotations

import functools
import itertools
import logging
from pathlib import Path

import anyio
import pytest
import torch
from multi_helpers import ActsSeven, writes_logits

from acollect import (
    ClosedCollectorError,
    ConfigurationError,
    GymEnv,
    MultiSyncCollector,
    RemoteError,
    ZmqWeightSyncScheme,
)
from acollect.testing import (
    RESET_JUMP,
    CountingEnv,
    CrashingEnv,
    Gate,
    TwoPartProbe,
    WeightProbe,
    assert_counting_batch,
)


def counting(num_envs: int = 2, episode_length: int = 3):
    return lambda: CountingEnv(num_envs=num_envs, episode_length=episode_length)


async def test_stacked_layout_and_unique_traj_ids(start_method: str) -> None:
    seen: list[torch.Tensor] = []
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, total_frames=48, start_method=start_method
    ) as collector:
        async for batch in collector:
            assert batch.batch_size == (2, 2, 4)
            assert batch.names == [None, None, "time"]
            assert_counting_batch(batch)
            assert batch["collector", "policy_version"].eq(0).all()
            assert batch["next", "reward"].shape == (2, 2, 4, 1)
            ids = batch["collector", "traj_ids"]
            # worker i hands out ids i, i + 2, i + 4...: disjoint across workers
            assert (ids[0] % 2 == 0).all()
            assert (ids[1] % 2 == 1).all()
            seen.append(ids)
        assert collector.frames == 48
        assert len(collector) == 3
    # a trajectory id never belongs to two (worker, env) pairs
    owners: dict[int, tuple[int, int]] = {}
    for ids in seen:
        for w in range(2):
            for e in range(2):
                for i in ids[w, e].unique().tolist():
                    assert owners.setdefault(i, (w, e)) == (w, e)


@pytest.mark.parametrize(("cat_results", "shape"), [(0, (4, 4)), (-1, (2, 8))])
async def test_cat_results(start_method: str, cat_results: int, shape: tuple[int, int]) -> None:
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=16, total_frames=16, cat_results=cat_results, start_method=start_method
    ) as collector:
        batch = await anext(collector)
    assert batch.batch_size == shape
    if cat_results == 0:
        assert_counting_batch(batch)


@pytest.mark.parametrize("use_shared_memory", [True, False])
async def test_batch_stays_valid_after_next_iteration(start_method: str, use_shared_memory: bool) -> None:
    async with MultiSyncCollector(
        [counting(episode_length=100)] * 2,
        frames_per_batch=16,
        use_shared_memory=use_shared_memory,
        start_method=start_method,
    ) as collector:
        first = await anext(collector)
        kept = first.clone()
        second = await anext(collector)
        third = await anext(collector)
    assert (first == kept).all()
    assert not (second["observation"] == first["observation"]).any()
    assert (third["observation"] - second["observation"] == 4).all()


async def test_weights_are_acknowledged_versioned_and_never_mixed(start_method: str) -> None:
    policy = WeightProbe(0.0)
    async with MultiSyncCollector(
        [counting()] * 2, policy, frames_per_batch=16, start_method=start_method
    ) as collector:
        batch = await anext(collector)
        assert batch["action"].eq(0).all()
        assert batch["collector", "policy_version"].eq(0).all()
        assert await collector.update_policy_weights_(WeightProbe(1.0)) == 1
        batch = await anext(collector)
        assert batch["action"].eq(1).all()
        assert batch["collector", "policy_version"].eq(1).all()
        # only worker 1 gets version 2; a version always comes with its own weights
        await collector.update_policy_weights_({"w": torch.zeros(1)}, worker_ids=[1])
        batch = await anext(collector)
        assert batch["action"][0].eq(1).all()
        assert batch["collector", "policy_version"][0].eq(1).all()
        assert batch["action"][1].eq(0).all()
        assert batch["collector", "policy_version"][1].eq(2).all()
        # no argument: re-send the policy given at construction
        await collector.update_policy_weights_()
        batch = await anext(collector)
        assert batch["action"].eq(0).all()
        assert batch["collector", "policy_version"].eq(3).all()


async def test_a_batch_begun_ahead_is_handed_out_with_the_version_that_made_it(start_method: str) -> None:
    # After a batch with no change before it, workers begin the next one at once. A push made while it
    # is under way (here: once it is complete) applies from the batch after it: no step is thrown away,
    # and every frame says which weights chose it.
    async with MultiSyncCollector(
        [counting(episode_length=1000)] * 2, WeightProbe(0.0), frames_per_batch=16, start_method=start_method
    ) as collector:
        await anext(collector)
        second = await anext(collector)
        assert collector.pool is not None
        with anyio.fail_after(30):  # the batch begun ahead arrives (made with version 0)
            while not all(h.lockstep.inbox for h in collector.pool.handles):  # noqa: ASYNC110 - polled on purpose
                await anyio.sleep(0.01)
        await collector.update_policy_weights_(WeightProbe(1.0))
        third = await anext(collector)
        fourth = await anext(collector)
        stats = collector.stats()
    assert third["action"].eq(0).all()
    assert third["collector", "policy_version"].eq(0).all()
    assert fourth["action"].eq(1).all()
    assert fourth["collector", "policy_version"].eq(1).all()
    # Contiguous: each batch starts where the last one ended (4 steps per env), nothing discarded.
    assert (third["observation"] - second["observation"]).eq(4).all()
    assert (fourth["observation"] - third["observation"]).eq(4).all()
    assert stats.discarded_frames == 0
    assert stats.dropped_batches == 0


async def test_pushes_queued_while_a_worker_is_mid_batch_apply_in_order(start_method: str, tmp_path: Path) -> None:
    # Worker 0 is held at a gate mid-way through its part of the second batch (the third asked for ahead) while three
    # pushes queue up in it. Each push's action is its version: a frame stamped with one version and acting with an
    # older push's weights shows.
    steps = 10
    with Gate(tmp_path) as gate:
        envs = [gate.env(hold_at_step=steps + steps // 2, num_envs=2, n_actions=8),
                functools.partial(CountingEnv, num_envs=2, n_actions=8)]  # fmt: skip
        async with MultiSyncCollector(
            envs, WeightProbe(0.0, high=7), frames_per_batch=2 * 2 * steps, start_method=start_method
        ) as collector:
            batches = [await anext(collector)]

            async def take() -> None:
                batches.append(await anext(collector))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(take)
                    await gate.wait_held()
                    for version in (1, 2, 3):
                        assert await collector.update_policy_weights_(WeightProbe(float(version))) == version
                    gate.open()
                batches += [await anext(collector), await anext(collector)]
    for batch in batches:
        assert torch.equal(batch["action"], batch["collector", "policy_version"]), "a frame acted with other weights"
        assert_counting_batch(batch)
    # The batches begun (or asked for) before the pushes keep version 0; the next ones act with the last push's.
    assert [batch["collector", "policy_version"].unique().tolist() for batch in batches] == [[0], [0], [0], [3]]


async def test_a_batch_begun_ahead_before_a_reseed_is_dropped_and_counted(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting(episode_length=1000)] * 2, WeightProbe(0.0), frames_per_batch=16, start_method=start_method
    ) as collector:
        await anext(collector)
        assert collector.pool is not None
        second = await anext(collector)
        with anyio.fail_after(30):
            while not all(h.lockstep.inbox for h in collector.pool.handles):  # noqa: ASYNC110 - polled on purpose
                await anyio.sleep(0.01)
        collector.set_seed(3)  # sent before the next batch is taken
        third = await anext(collector)
        stats = collector.stats()
    # The fresh, seeded start the caller asked for (a reset adds RESET_JUMP), never the batch begun before
    # it, whose 4 steps per env were taken and given up...
    gap = third["observation"][:, :, 0, 0] - second["next", "observation"][:, :, -1, 0]
    assert gap.eq(4 + RESET_JUMP).all(), gap
    # ...and counted: 2 workers x 2 envs x 4 steps.
    assert stats.discarded_frames == 16


async def test_a_loop_that_pushes_before_every_batch_gets_every_frame(start_method: str) -> None:
    policy = WeightProbe(0.0)
    async with MultiSyncCollector(
        [counting(episode_length=1000)] * 2, policy, frames_per_batch=16, start_method=start_method
    ) as collector:
        observations = []
        for value in (1.0, 0.0, 1.0):
            batch = await anext(collector)
            observations.append(batch["observation"])
            await anyio.sleep(0.05)  # time enough for a batch begun ahead, were there one
            await collector.update_policy_weights_(WeightProbe(value))
        observations.append((await anext(collector))["observation"])
    assert all((b - a).eq(4).all() for a, b in itertools.pairwise(observations))


async def test_several_models_updated_atomically_over_zmq(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting()] * 2,
        TwoPartProbe(),
        frames_per_batch=8,
        weight_sync_schemes={"policy.a": ZmqWeightSyncScheme(), "policy.b": ZmqWeightSyncScheme()},
        start_method=start_method,
    ) as collector:
        version = await collector.update_policy_weights_(
            weights_dict={"policy.a": WeightProbe(1.0), "policy.b": {"w": torch.ones(1)}}
        )
        batch = await anext(collector)
    assert version == 1
    assert batch["action"].eq(1).all()
    assert batch["collector", "policy_version"].eq(1).all()


async def test_update_after_each_batch_pushes_the_trainers_policy(start_method: str) -> None:
    policy = WeightProbe(0.0)
    async with MultiSyncCollector(
        [counting()] * 2,
        policy,
        frames_per_batch=8,
        total_frames=24,
        update_after_each_batch=True,
        start_method=start_method,
    ) as collector:
        versions, actions = [], []
        async for batch in collector:
            versions.append(batch["collector", "policy_version"].unique().tolist())
            actions.append(batch["action"].unique().tolist())
            with torch.no_grad():
                policy.w.fill_(1.0)
    assert versions == [[0], [1], [2]]
    assert actions == [[0], [1], [1]]


async def test_seeds_are_distinct_per_worker_and_deterministic(start_method: str) -> None:
    async def first_batch(seed: int) -> torch.Tensor:
        async with MultiSyncCollector(
            "CartPole-v1", num_workers=2, frames_per_batch=8, env_kwargs={"num_envs": 2}, start_method=start_method
        ) as collector:
            assert collector.set_seed(seed) == seed + 4  # 2 workers x 2 envs
            batch = await anext(collector)
            return batch["observation"]

    a, b = await first_batch(7), await first_batch(7)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # worker 0 envs got seeds 7, 8; worker 1 envs 9, 10


async def test_state_dict_continues_trajectory_ids(start_method: str) -> None:
    kwargs = {"frames_per_batch": 8, "start_method": start_method}
    async with MultiSyncCollector([counting()] * 2, **kwargs) as collector:
        first = await anext(collector)
        state = collector.state_dict()
    assert state["frames"] == 8
    assert state["batches"] == 1
    assert [w["next_traj_counter"] for w in state["workers"]] == [2, 2]  # T=2 < episode_length: no new episode
    async with MultiSyncCollector([counting()] * 2, **kwargs) as resumed:
        resumed.load_state_dict(state)
        second = await anext(resumed)
        assert resumed.frames == 16
    old = set(first["collector", "traj_ids"].unique().tolist())
    new = set(second["collector", "traj_ids"].unique().tolist())
    assert not old & new


async def test_tcp_address(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting()] * 2, frames_per_batch=8, total_frames=16, address="tcp://127.0.0.1:0", start_method=start_method
    ) as collector:
        shapes = [tuple(batch.shape) async for batch in collector]
    assert shapes == [(2, 2, 2), (2, 2, 2)]


async def test_shutdown_is_idempotent_and_closed_means_closed(start_method: str) -> None:
    collector = MultiSyncCollector([counting()] * 2, frames_per_batch=8, start_method=start_method)
    async with collector:
        await anext(collector)
    await collector.async_shutdown(timeout=1.0)
    with pytest.raises(ClosedCollectorError):
        await anext(collector)


async def test_spawned_workers_start_and_stop(no_leaks: None) -> None:
    # The default start method: fresh interpreters, nothing of multiprocessing left behind.
    async with MultiSyncCollector([counting()] * 2, frames_per_batch=8, total_frames=8) as collector:
        pids = collector.worker_pids
        assert all(pids)
        assert len(set(pids)) == 2
        assert [tuple(b.shape) async for b in collector] == [(2, 2, 2)]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"cat_results": 1}, "cat_results"),
        ({"collector_kwargs": {"colour": 1}}, "collector_kwargs"),
        ({"collector_kwargs": [{}]}, "collector_kwargs"),
        ({"num_workers": 3}, "num_workers"),
        ({"start_method": "fork"}, "start_method"),
        ({"device": ["cpu"]}, "device"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout"),
        ({"max_worker_restarts": -1}, "max_worker_restarts"),
        ({"weight_sync_schemes": {"policy": "zmq"}}, "weight_sync_schemes"),
        ({"frames_per_batch": 0}, "frames_per_batch"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, name: str) -> None:
    args = {"frames_per_batch": 8, **kwargs}
    with pytest.raises(ConfigurationError, match=name):
        MultiSyncCollector([counting()] * 2, **args)


async def test_cancelled_consumer_leaves_nothing(start_method: str) -> None:
    from acollect.testing import SlowEnv

    collector = MultiSyncCollector(
        [lambda: SlowEnv(step_time=0.05)] * 2, frames_per_batch=1000, start_method=start_method
    )
    async with collector:
        with anyio.move_on_after(1.0) as scope:
            await anext(collector)
        assert scope.cancelled_caught


def test_an_unregistered_gym_id_is_refused_at_construction() -> None:
    for env in ("CartPol-v1", functools.partial(GymEnv, "CartPol-v1", num_envs=2)):
        with pytest.raises(ConfigurationError, match=r"'CartPol-v1' is not a registered.*did you mean 'CartPole-v1'"):
            MultiSyncCollector(env, num_workers=2, frames_per_batch=8)
    with pytest.raises(ConfigurationError, match=r"create_env_fn_list\[1\]='NoSuchEnv-v0'"):
        MultiSyncCollector(["CartPole-v1", "NoSuchEnv-v0"], frames_per_batch=8)


@pytest.mark.parametrize(
    ("policy", "match"),
    [(writes_logits, "did not write 'action'"), (ActsSeven(), r"outside the action space: 7.*Categorical")],
    ids=["no-action-key", "action-out-of-space"],
)
async def test_a_policy_refused_in_the_worker_fails_entry_not_the_first_batch(
    start_method: str, policy: object, match: str
) -> None:
    # The worker checks the policy when it builds it and reports before its hello: `async with` raises.
    collector = MultiSyncCollector("CartPole-v1", policy, num_workers=2, frames_per_batch=8, start_method=start_method)
    with anyio.fail_after(60), pytest.raises(RemoteError, match=match) as info:
        await collector.__aenter__()
    assert info.value.type_name.rsplit(".", 1)[-1] == "PolicyError"
    assert collector.frames == 0


async def test_frames_per_batch_rounded_at_construction_when_the_arguments_say_the_envs(start_method: str) -> None:
    with pytest.warns(UserWarning, match=r"\(2 workers x 3 envs\): each batch holds 102 frames") as w:
        collector = MultiSyncCollector(
            functools.partial(GymEnv, "CartPole-v1", num_envs=3), num_workers=2, frames_per_batch=100,
            total_frames=204, start_method=start_method,
        )  # fmt: skip
    assert [x.filename for x in w] == [__file__]
    assert (collector.requested_frames_per_batch, collector.frames_per_batch, len(collector)) == (100, 102, 2)
    async with collector:
        sizes = [batch.numel() async for batch in collector]
    assert sizes == [102, 102]


async def test_frames_per_batch_rounded_at_set_up_when_only_the_workers_know(start_method: str) -> None:
    collector = MultiSyncCollector([counting(num_envs=3)] * 2, frames_per_batch=100, start_method=start_method)
    assert collector.frames_per_batch == 100  # a factory: only building the envs tells how many
    with pytest.warns(UserWarning, match=r"\(2 workers x 3 envs\): each batch holds 102 frames") as w:
        async with collector:
            batch = await anext(collector)
    assert [x.filename for x in w] == [__file__]
    assert collector.frames_per_batch == batch.numel() == 102


async def test_a_remote_traceback_is_raised_once_never_logged_too(
    start_method: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    # A user with no logging configured would see a logged error through logging's last-resort handler,
    # then the same traceback again in the exception: only the exception carries it.
    caplog.set_level(logging.DEBUG, logger="acollect")
    collector = MultiSyncCollector(
        [CountingEnv, lambda: CrashingEnv(crash_at_step=3, exc_type=KeyError)], frames_per_batch=20,
        start_method=start_method,
    )  # fmt: skip
    async with collector:
        with anyio.fail_after(30), pytest.raises(RemoteError) as info:
            await anext(collector)
    assert "CrashingEnv crashed at step 3" in str(info.value)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    out, err = capfd.readouterr()
    assert "CrashingEnv crashed at step 3" not in out + err
