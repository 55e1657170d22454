"""Workers as Ray actors, on a real local Ray cluster of 2 CPUs: RayCollector and launcher="ray".

Each test starts real actors (a few seconds each); the cluster is started once for the module.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest
import torch

from acollect import (
    ConfigurationError,
    MultiAsyncCollector,
    MultiSyncCollector,
    RayCollector,
    ReplayBuffer,
    WorkerCrashedError,
)
from acollect.launchers import RayLauncher
from acollect.testing import CountingEnv, GroupCountingEnv, WeightProbe, assert_group_counting_batch, wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(300)


async def _drain(collector: MultiAsyncCollector | MultiSyncCollector) -> None:
    """Iterates until the collector raises (each wait inside has its own deadline)."""
    for _ in range(1000):
        await anext(collector)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    # On the main thread: a local cluster's processes die with the thread that started them.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _dead(actor: object, within: float = 30.0) -> bool:
    """Whether ``actor`` is gone. ``ray.kill`` takes effect asynchronously: a probe sent just after it may still be run
    by the actor (it fails to unpack an empty config), so a live answer is asked again until ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        ref = actor.run.remote(b"")  # type: ignore[attr-defined]
        try:
            ray.get(ref, timeout=30)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.RayTaskError:
            pass  # it ran the probe: alive for now
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


async def test_sync_ray_collector_stacks_batches_pushes_weights_and_restarts_a_killed_actor() -> None:
    collector = RayCollector(
        [CountingEnv, CountingEnv], WeightProbe(0.0), frames_per_batch=8, sync=True,
        remote_configs={"num_cpus": 1}, max_worker_restarts=1,
    )  # fmt: skip
    async with collector:
        batch = await anext(collector)
        assert batch.shape == (2, 1, 4)
        assert batch["action"].eq(0).all()
        traj = batch["collector", "traj_ids"][:, 0, 0].tolist()
        assert len(set(traj)) == 2
        actors = collector.remote_collectors
        assert len(actors) == 2
        assert collector.settings.launcher.connect_address(collector.endpoint_address or "").startswith("tcp://")

        assert await collector.update_policy_weights_(WeightProbe(1.0)) == 1
        batch = await anext(collector)
        assert batch["action"].eq(1).all()
        assert batch["collector", "policy_version"].eq(1).all()

        # A dead actor is noticed through its run() call and replaced by a fresh one, weights included.
        ray.kill(actors[0], no_restart=True)
        await wait_until(lambda: collector.stats().restarts == 1, timeout=60)
        batch = await anext(collector)
        assert batch.shape == (2, 1, 4)
        assert collector.remote_collectors[0] != actors[0]
        for _ in range(3):
            batch = await anext(collector)
        assert batch["action"].eq(1).all()
        state = collector.state_dict()
        assert [w["frames"] > 0 for w in state["workers"]] == [True, True]
        assert collector.set_seed(7) == 9
        await anext(collector)
        actors = collector.remote_collectors
    assert all(_dead(a) for a in actors), "shutdown leaves no actor holding resources"


@pytest.mark.parametrize(("sync", "frames_per_batch", "shape"), [(True, 8, (2, 1, 4)), (False, 4, (1, 4))])
async def test_one_ray_collector_class_in_both_modes(sync: bool, frames_per_batch: int, shape: tuple[int, ...]) -> None:
    # sync picks the dispatch strategy, not a class: lockstep stacks a part from each actor, first ready
    # hands out one actor's batch.
    collector = RayCollector([CountingEnv] * 2, frames_per_batch=frames_per_batch, sync=sync)
    assert type(collector) is RayCollector
    async with collector:
        batch = await anext(collector)
        assert batch.shape == shape
        assert (("collector", "worker_id") in batch.keys(True)) is not sync


async def test_killed_actor_without_restarts_is_reported_with_its_actor() -> None:
    collector = MultiAsyncCollector(
        [CountingEnv] * 2, frames_per_batch=4, launcher=RayLauncher(remote_configs=[{"num_cpus": 1}] * 2)
    )
    async with collector:
        await anext(collector)
        pool = collector.pool
        assert pool is not None
        victim = pool.handles[1].process
        ray.kill(victim.actor, no_restart=True)  # type: ignore[union-attr]
        with pytest.raises(WorkerCrashedError, match=r"worker 1 \(Ray actor \w+ \(ended: .*ActorDiedError"):
            await _drain(collector)


async def test_async_ray_collector_fills_its_replay_buffer_in_the_background() -> None:
    rb = ReplayBuffer(1000)
    collector = RayCollector(CountingEnv, num_collectors=2, frames_per_batch=4, replay_buffer=rb)
    async with collector:
        collector.start()
        await wait_until(lambda: len(rb) >= 40, timeout=60)
        async with collector.pause():
            pass
    assert len(rb) >= 40
    assert collector.state.name == "CLOSED"


def test_an_event_loop_that_ends_under_the_collector_ends_its_actors_and_warns() -> None:
    import anyio

    collector = RayCollector([CountingEnv], frames_per_batch=4, sync=True)

    async def take_one() -> list[object]:
        await collector.__aenter__()
        await anext(collector)
        return collector.remote_collectors  # the loop ends here without async_shutdown()

    with pytest.warns(ResourceWarning, match="never shut down: the event loop it started on ended"):
        actors = anyio.run(take_one)
    assert collector.state.name == "CLOSED"
    assert all(_dead(a) for a in actors)
    collector.shutdown(timeout=5)  # TorchRL's blocking spelling, after the fact: nothing left to do
    assert collector.state.name == "CLOSED"


@pytest.mark.slow  # starts and stops a Ray of its own (about 20 s)
def test_shutdown_ray_ends_the_ray_the_collector_started() -> None:
    import anyio

    local = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}

    async def collect(collector: RayCollector) -> None:
        async with collector:
            await anext(collector)
            assert ray.is_initialized()

    ray.shutdown()  # the module's cluster: each collector here starts its own
    try:
        # An option given at construction, applied by the shutdown every collector shares.
        collector = RayCollector([CountingEnv], frames_per_batch=4, sync=True, ray_init_config=local, shutdown_ray=True)
        anyio.run(collect, collector)
        assert collector.state.name == "CLOSED"
        assert not ray.is_initialized()

        # TorchRL's blocking spelling, after `async with` closed the collector with Ray left up.
        collector = RayCollector([CountingEnv], frames_per_batch=4, sync=True, ray_init_config=local)
        anyio.run(collect, collector)
        assert ray.is_initialized()
        collector.shutdown(shutdown_ray=True)
        assert not ray.is_initialized()
    finally:
        if not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # for the tests that follow


def test_shutdown_ray_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="shutdown_ray"):
        RayCollector([CountingEnv], frames_per_batch=4, shutdown_ray="yes")  # type: ignore[arg-type]


async def test_a_ray_collector_collects_on_without_a_lost_actor_in_whole_episodes() -> None:
    # on_worker_loss and trajs_per_batch through Ray actors: the options the local pool honours, honoured here.
    collector = RayCollector(
        [CountingEnv] * 2, frames_per_batch=4, trajs_per_batch=2, on_worker_loss="continue",
        remote_configs={"num_cpus": 1},
    )  # fmt: skip
    async with collector:
        batch = await anext(collector)
        assert batch.batch_size[0] == 2
        assert batch["collector", "mask"].any(-1).all()
        actors = collector.remote_collectors
        ray.kill(actors[1], no_restart=True)
        await wait_until(lambda: collector.stats().lost_workers == 1, timeout=60)
        for _ in range(3):
            batch = await anext(collector)
            last = batch["collector", "mask"].sum(-1) - 1
            assert batch["next", "done"][torch.arange(batch.batch_size[0]), last].all()  # whole (or cut) episodes
        assert collector.stats().lost_workers == 1


async def test_multi_agent_frames_come_through_ray_actors_whole() -> None:
    env = functools.partial(GroupCountingEnv, num_envs=2, episode_length=[3, 4])
    async with RayCollector([env, env], frames_per_batch=16, total_frames=48, sync=True) as collector:
        async for batch in collector:
            assert batch["next", "blue", "reward"].shape[-2:] == (1, 1)
            assert_group_counting_batch(batch.reshape(-1, batch.shape[-1]))
