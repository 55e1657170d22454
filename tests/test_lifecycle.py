"""The rules for calling a collector from several tasks, for every collector class, under asyncio and trio.

Each test is a plain function running its scenario with ``anyio.run(..., backend=...)``, so the same
code runs on both event loops, and every scenario has its own deadline (``anyio.fail_after``): an
overlap that hangs fails the test instead of the suite. After each scenario, nothing is left: no
worker process, no shared-memory segment, no acollect thread.

Collector classes: in-process, MultiSync, MultiAsync, AsyncCollector, DistributedCollector (a real gloo
process group), AsyncBatchedCollector (env workers, the policy in this process's inference
server) and the in-process collector over coroutine envs (``AsyncEnvs``: an ``AsyncEnvPool`` of
``AsyncCountingEnv``, each env a task on the loop); RayCollector needs asyncio and a Ray cluster, and
is checked in ``tests/launchers``.

The rules (``docs/concepts.md``, "Calling from several tasks"):

* two ``async_shutdown()`` at once: both return only when everything is gone;
* ``async_shutdown()`` under a task waiting for a batch: that task gets ``ClosedCollectorError`` promptly;
* two consumers: served one after the other;
* ``pause()`` from two tasks: nothing is collected while either holds it;
* a cancelled first batch (no ``async with``) leaves nothing behind and the collector usable;
* a weight push during iteration lands at a batch boundary and returns the new version;
* a failure moves the collector to BROKEN; calls raise it; ``async_shutdown()`` closes it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import torch

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    CollectorState,
    DistributedCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
)
from acollect.collectors._base import CollectorBase
from acollect.envs import AsyncEnvPool
from acollect.errors import ClosedCollectorError, CollectorStateError, EnvError, RemoteError, WorkerError
from acollect.testing import (
    ENV_STRIDE,
    RESET_JUMP,
    AsyncCountingEnv,
    CountingEnv,
    CrashingEnv,
    ResourceSnapshot,
    SlowEnv,
    WeightProbe,
    assert_counting_batch,
    assert_no_leaks,
    leaked_resources,
    wait_until,
)

START_METHOD = os.environ.get("ACOLLECT_TEST_START_METHOD", "forkserver")
BACKENDS = ["asyncio", "trio"]
KINDS = ["Collector", "MultiSync", "MultiAsync", "AsyncCollector", "Distributed", "Batched", "AsyncEnvs"]


def matrix(*, slow_under_trio: tuple[str, ...] = ("Batched",)) -> list[Any]:
    """Every collector kind under every backend, as ``(kind, backend)`` parameters.

    A scenario that takes seconds is marked ``slow`` under trio for the kinds named (the README's
    ``pytest`` leaves those out, CI runs them): the same rules under asyncio run every time, and what
    differs by backend runs under trio in the faster scenarios.
    """
    return [
        pytest.param(kind, backend, id=f"{kind}-{backend}",
                     marks=[pytest.mark.slow] if backend == "trio" and kind in slow_under_trio else [])
        for kind in KINDS
        for backend in BACKENDS
    ]  # fmt: skip


pytestmark = pytest.mark.timeout(120)


def make(kind: str, env: Callable[[], Any], policy: Any = None, **kwargs: Any) -> CollectorBase:
    """A collector of ``kind`` over ``env`` (two workers for the Multi* collectors)."""
    kwargs.setdefault("frames_per_batch", 8)
    if kind == "Collector":
        return Collector(env, policy, **kwargs)
    if kind == "AsyncEnvs":
        return Collector(coroutine_twin(env), policy, **kwargs)
    workers = {"start_method": START_METHOD, "shutdown_timeout": 5.0}
    if kind == "MultiSync":
        return MultiSyncCollector([env] * 2, policy, **workers, **kwargs)
    if kind == "MultiAsync":
        return MultiAsyncCollector([env] * 2, policy, **workers, **kwargs)
    if kind == "Distributed":  # batches and weights over a real gloo process group
        return DistributedCollector(env, policy, num_workers=2, backend="gloo", **workers, **kwargs)
    if kind == "Batched":  # central inference: a policy is required (None would mean random actions)
        return AsyncBatchedCollector([env] * 2, policy if policy is not None else WeightProbe(0.0), **workers, **kwargs)
    return AsyncCollector(env, policy, **workers, **kwargs)


def coroutine_twin(env: Any) -> Callable[[], AsyncEnvPool]:
    """The same scenario's envs as coroutine envs: a pool of ``AsyncCountingEnv`` (slow, crashing alike)."""
    assert isinstance(env, functools.partial), env
    keywords = dict(env.keywords)
    num_envs = keywords.pop("num_envs", 1)
    twin: dict[str, Any] = {}
    if "episode_length" in keywords:
        twin["episode_length"] = keywords.pop("episode_length")
    if env.func is SlowEnv:
        twin = {"step_time": env.args[0], "reset_time": keywords.pop("reset_time", 0.0)}
    elif env.func is CrashingEnv:
        twin = {"crash_at_step": keywords.pop("crash_at_step")}
    else:
        assert env.func is CountingEnv, env
    return functools.partial(AsyncEnvPool, functools.partial(AsyncCountingEnv, **twin), num_envs)


def run(backend: str, scenario: Callable[[], Awaitable[None]], *, leak_timeout: float = 5.0) -> None:
    """Runs ``scenario`` on ``backend`` and checks that it left nothing behind."""
    before = ResourceSnapshot.take()
    anyio.run(scenario, backend=backend)
    assert_no_leaks(before, timeout=leak_timeout)


counting = functools.partial(CountingEnv, num_envs=2)
slow = functools.partial(SlowEnv, 0.05, num_envs=2)  # 50 ms a step: a batch of 8 frames takes 200 ms


@pytest.mark.parametrize(("kind", "backend"), matrix())
def test_two_concurrent_shutdowns_both_return_when_everything_is_gone(kind: str, backend: str) -> None:
    async def scenario() -> None:
        before = ResourceSnapshot.take()
        collector = make(kind, counting)
        with anyio.fail_after(60):
            await anext(collector)
            returned: list[CollectorState] = []
            left: list[list[str]] = []

            async def shut() -> None:
                await collector.async_shutdown()
                returned.append(collector.state)  # each caller sees the end state, not CLOSING
                left.append(leaked_resources(before, timeout=0.0))  # and nothing is left when it returns

            async with anyio.create_task_group() as tg:
                tg.start_soon(shut)
                tg.start_soon(shut)
            assert returned == [CollectorState.CLOSED, CollectorState.CLOSED]
            assert left == [[], []], f"async_shutdown() returned while these were still alive: {left}"
            await collector.async_shutdown()  # and a third, later, is fine

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=()))
def test_shutdown_wakes_a_task_waiting_for_a_batch(kind: str, backend: str) -> None:
    async def scenario() -> None:
        collector = make(kind, slow, frames_per_batch=400)  # 10 s a batch: the waiter is mid-batch
        outcome: list[BaseException] = []

        async def consume() -> None:
            try:
                await anext(collector)
            except ClosedCollectorError as exc:
                outcome.append(exc)

        with anyio.fail_after(60):
            async with collector:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    await anyio.sleep(0.3)
                    with anyio.fail_after(8):  # promptly: well before the batch would end
                        await collector.async_shutdown()
        assert len(outcome) == 1, "the waiting consumer must get ClosedCollectorError"
        assert "async_shutdown()" in str(outcome[0])

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=()))
def test_two_consumers_are_served_in_turn(kind: str, backend: str) -> None:
    async def scenario() -> None:
        got: list[int] = []

        async def consume(collector: CollectorBase) -> None:
            for _ in range(3):
                batch = await anext(collector)
                got.append(batch.numel())

        with anyio.fail_after(60):
            async with make(kind, counting) as collector:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume, collector)
                    tg.start_soon(consume, collector)
                assert collector.frames == sum(got)
        assert len(got) == 6

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=()))
def test_two_consumers_of_whole_episodes_are_served_in_turn(kind: str, backend: str) -> None:
    # trajs_per_batch hands out by its own path (batches gathered into episodes): the same rules hold.
    async def scenario() -> None:
        got: list[int] = []

        async def consume(collector: CollectorBase) -> None:
            for _ in range(3):
                batch = await anext(collector)
                assert batch.batch_size[0] == 2
                got.append(int(batch["collector", "mask"].sum()))

        episodes = functools.partial(CountingEnv, num_envs=2, episode_length=3)
        with anyio.fail_after(60):
            async with make(kind, episodes, trajs_per_batch=2) as collector:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume, collector)
                    tg.start_soon(consume, collector)
        assert got == [6] * 6  # every batch two whole episodes of 3 steps, none handed out twice

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=()))
def test_shutdown_wakes_a_task_waiting_for_whole_episodes(kind: str, backend: str) -> None:
    async def scenario() -> None:
        # Episodes that do not end before the shutdown: the waiter is gathering batches into them.
        collector = make(kind, functools.partial(SlowEnv, 0.01, num_envs=2, episode_length=100_000), trajs_per_batch=2)
        outcome: list[BaseException] = []

        async def consume() -> None:
            try:
                await anext(collector)
            except ClosedCollectorError as exc:
                outcome.append(exc)

        with anyio.fail_after(60):
            async with collector:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    await wait_until(lambda: collector.frames >= 16, timeout=30)  # batches gathered, none handed out
                    with anyio.fail_after(8):
                        await collector.async_shutdown()
        assert len(outcome) == 1, "the waiting consumer must get ClosedCollectorError"

    run(backend, scenario)


def progress(collector: CollectorBase, rb: ReplayBuffer) -> tuple[int, ...]:
    """Frames in the buffer, and each worker's env steps as its last heartbeat said (workers step ahead)."""
    pool = getattr(collector, "pool", None)
    return (len(rb), *(handle.heartbeats.last_steps for handle in (pool.handles if pool is not None else [])))


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=tuple(KINDS)))
def test_pauses_from_two_tasks_overlap(kind: str, backend: str) -> None:
    async def scenario() -> None:
        rb = ReplayBuffer(1_000_000)
        held = [0]
        both_in = anyio.Event()
        release = [anyio.Event(), anyio.Event()]
        left = [anyio.Event(), anyio.Event()]
        seen: dict[str, tuple[int, ...]] = {}

        async def hold(collector: CollectorBase, i: int) -> None:
            async with collector.pause():  # both tasks enter at the same moment
                held[0] += 1
                if held[0] == 2:
                    both_in.set()
                await release[i].wait()
            left[i].set()

        # 10 ms a step, 100 steps a batch, 0.5 s heartbeats: a worker that was not paused shows it.
        extra = {} if kind in ("Collector", "AsyncEnvs") else {"heartbeat_timeout": 2.0}
        env = functools.partial(SlowEnv, 0.01, num_envs=2)
        with anyio.fail_after(60):
            async with make(kind, env, frames_per_batch=200, **extra) as collector:
                collector.start(replay_buffer=rb)
                await wait_until(lambda: len(rb) >= 200, timeout=20)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(hold, collector, 0)
                    tg.start_soon(hold, collector, 1)
                    await both_in.wait()
                    await anyio.sleep(0.8)  # a step in flight and the next heartbeat settle
                    seen["both held"] = progress(collector, rb)
                    await anyio.sleep(1.2)
                    seen["later"] = progress(collector, rb)
                    release[0].set()
                    await left[0].wait()
                    await anyio.sleep(1.2)  # the first pause ended: workers must still be stopped
                    seen["one held"] = progress(collector, rb)
                    release[1].set()
                assert collector.state is CollectorState.RUNNING
                resumed_from = len(rb)
                await wait_until(lambda: len(rb) > resumed_from, timeout=20)  # both left: collection goes on
        assert seen["both held"] == seen["later"] == seen["one held"], f"collected while paused: {seen}"

    run(backend, scenario)


#: Worker processes of each kind (:func:`make`); the others collect with one.
WORKERS = {"MultiSync": 2, "MultiAsync": 2, "Distributed": 2, "Batched": 2}


def assert_whole_batch(kind: str, batch: Any, *, after: Any = None) -> None:
    """Asserts that ``batch``, from :data:`counting` envs, holds real steps that begin where they must.

    ``after``: the batch handed out just before it, whose streams it continues where both come from the same worker;
    ``None``: it is the first batch handed out, so every env row begins at the first step its env took, and carries
    the first trajectory id its worker gave that env (``worker + n_workers * env``). In every case a row's trajectory
    id changes exactly where an episode ended, and no two rows share one.
    """
    batch = batch.cpu()
    steps, n_envs, n_workers = batch.shape[-1], 2, WORKERS.get(kind, 1)
    obs, after_obs = batch["observation"][..., 0], batch["next", "observation"][..., 0]
    done, ids = batch["next", "done"][..., 0], batch["collector", "traj_ids"]
    if kind == "AsyncEnvs":  # each observation counts the steps since its env's reset
        assert (after_obs - obs).eq(1).all(), "not a real step"
        assert torch.equal(obs[..., 1:], torch.where(done[..., :-1], 0, after_obs[..., :-1])), "a gap or a repeat"
        fresh = obs[..., 0].eq(0)
    else:
        assert_counting_batch(batch)
        fresh = (obs[..., 0] % ENV_STRIDE) % RESET_JUMP == 0  # a reset observation of an env that never stepped
    assert torch.equal(ids[..., 1:] != ids[..., :-1], done[..., :-1]), "trajectory ids do not follow the episodes"
    rows = ids.reshape(-1, steps)
    owner: dict[int, int] = {}
    for row, row_ids in enumerate(rows.tolist()):
        for traj in set(row_ids):
            assert owner.setdefault(traj, row) == row, f"env rows {owner[traj]} and {row} share trajectory id {traj}"
    if "worker_id" in batch["collector"].keys():
        workers = batch["collector", "worker_id"].reshape(-1, steps)[:, 0]
    else:  # in-process (one "worker"), or stacked per worker
        workers = torch.arange(rows.shape[0]) // n_envs
    if after is None:
        assert fresh.all(), f"the first batch does not begin at the envs' first steps: {obs[..., 0].tolist()}"
        first_ids = workers + n_workers * (torch.arange(rows.shape[0]) % n_envs)
        assert torch.equal(rows[:, 0], first_ids), f"not the first trajectory ids: {rows[:, 0].tolist()}"
        return
    after = after.cpu()
    same_worker = "worker_id" not in batch["collector"].keys() or torch.equal(
        after["collector", "worker_id"], batch["collector", "worker_id"]
    )
    if same_worker:
        ended = after["next", "done"][..., -1, 0]
        tail = after["next", "observation"][..., -1, 0]
        if kind == "AsyncEnvs":
            expected = torch.where(ended, 0, tail)
        else:
            expected = tail + RESET_JUMP * ended
        assert torch.equal(obs[..., 0], expected), "a gap or a repeat between two batches"


@pytest.mark.parametrize(("kind", "backend"), matrix())
def test_cancelled_first_batch_leaves_nothing_and_the_collector_usable(kind: str, backend: str) -> None:
    async def scenario() -> None:
        # Several delays, so one of them lands in the middle of the set-up (workers starting).
        for delay in (0.02, 0.15, 0.4):
            collector = make(kind, counting)  # no ``async with``: set-up happens in the first anext
            with anyio.fail_after(60):
                first = []
                with anyio.move_on_after(delay) as scope:
                    first.append(await anext(collector))
                if scope.cancelled_caught:
                    assert collector.state in (CollectorState.NEW, CollectorState.RUNNING)
                batch = await anext(collector)  # usable: a retry starts afresh
                assert batch.numel() == 8
                # Nothing of a cancelled attempt shows (no step lost or repeated, no id given twice), and a batch
                # after a first one continues it.
                assert_whole_batch(kind, batch, after=first[0] if first else None)
                await collector.async_shutdown()

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=()))
def test_weight_push_during_iteration_lands_at_a_batch_boundary(kind: str, backend: str) -> None:
    async def scenario() -> None:
        with anyio.fail_after(60):
            async with make(kind, counting, WeightProbe(0.0)) as collector:
                pushed: list[int] = []

                async def push() -> None:
                    pushed.append(await collector.update_policy_weights_(WeightProbe(1.0)))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(push)
                    await anext(collector)
                assert pushed == [1], "update_policy_weights_ returns the new version"
                for _ in range(6):  # MultiAsync may hand out batches collected ahead, before the push
                    batch = await anext(collector)
                    if kind in ("Batched", "AsyncEnvs"):  # the version is per step: the weights that chose each action
                        version = batch["collector", "policy_version"]
                        assert (batch["action"] == version).all(), "an action not chosen by its version's weights"
                        assert (version.diff(dim=-1) >= 0).all(), "versions go back in time"
                        if (version == 1).any():
                            break
                        continue
                    versions = batch["collector", "policy_version"].unique().tolist()
                    assert len(versions) == 1, f"a batch mixes weight versions: {versions}"
                    if versions == [1]:
                        assert batch["action"].unique().tolist() == [1]
                        break
                else:
                    pytest.fail("no batch was collected with the pushed weights")

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix(slow_under_trio=()))
def test_a_failure_breaks_the_collector_until_shutdown(kind: str, backend: str) -> None:
    async def scenario() -> None:
        collector = make(kind, functools.partial(CrashingEnv, crash_at_step=3, num_envs=2))
        expected: Any = {"Collector": RuntimeError, "AsyncEnvs": EnvError}.get(kind, (RemoteError, WorkerError))
        with anyio.fail_after(60):
            with pytest.raises(expected):
                async for _ in collector:
                    pass
            assert collector.state is CollectorState.BROKEN
            with pytest.raises(expected):
                await anext(collector)
            with pytest.raises(expected):
                async with collector.pause():
                    pass
            await collector.async_shutdown()
            assert collector.state is CollectorState.CLOSED
            with pytest.raises(ClosedCollectorError):
                await anext(collector)

    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_iterating_a_background_collector_is_refused_at_once(backend: str) -> None:
    async def scenario() -> None:
        with anyio.fail_after(30):
            async with Collector(counting, frames_per_batch=8) as collector:
                collector.start(ReplayBuffer(1000))
                with pytest.raises(CollectorStateError, match="background"):
                    await anext(collector)

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix())
def test_shutdown_from_another_task_ends_a_set_up_in_progress(kind: str, backend: str) -> None:
    async def scenario() -> None:
        # Workers that take seconds to say hello: the shutdown lands while `async with` is setting up.
        env = functools.partial(SlowEnv, 0.0, num_envs=2, reset_time=3.0)
        collector = make(kind, env, reset_at_each_iter=False)
        outcome: list[BaseException] = []

        async def enter() -> None:
            try:
                async with collector:
                    await anext(collector)
            except ClosedCollectorError as exc:
                outcome.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(enter)
                await anyio.sleep(0.5)
                await collector.async_shutdown()
        assert collector.state is CollectorState.CLOSED
        assert len(outcome) == 1, "the task setting the collector up must get ClosedCollectorError"

    run(backend, scenario)


# -- the event loop a collector belongs to (docs/concepts.md, "One event loop") ------------------------------


@pytest.mark.parametrize(("kind", "backend"), matrix())
def test_an_exhausted_collector_shuts_itself_down(kind: str, backend: str) -> None:
    async def scenario() -> None:
        collector = make(kind, counting, total_frames=16)
        with anyio.fail_after(60):
            frames = sum([batch.numel() async for batch in collector])  # no `async with`, no async_shutdown()
            assert frames == 16
            assert collector.state is CollectorState.CLOSED  # its workers, sockets and memory are gone already
            assert [batch async for batch in collector] == []  # an ended iterator stays ended
            with pytest.raises(ClosedCollectorError, match="collected its total_frames and shut itself down"):
                async with collector.pause():
                    pass
            assert collector.stats().frames == 16  # what it did stays readable
            async with make(kind, counting, total_frames=16) as scoped:  # the block owns its life instead
                assert sum([batch.numel() async for batch in scoped]) == 16
                assert scoped.state is CollectorState.RUNNING
            assert scoped.state is CollectorState.CLOSED

    run(backend, scenario)


@pytest.mark.parametrize(("kind", "backend"), matrix())
def test_a_collector_left_open_is_released_when_its_event_loop_ends(kind: str, backend: str) -> None:
    before = ResourceSnapshot.take()
    collector = make(kind, counting)

    async def take_one() -> None:
        with anyio.fail_after(60):
            await anext(collector)  # set up, and never shut down

    with pytest.warns(ResourceWarning, match="never shut down: the event loop it started on ended"):
        anyio.run(take_one, backend=backend)
    assert collector.state is CollectorState.CLOSED
    assert_no_leaks(before, timeout=5.0)
    with pytest.raises(ClosedCollectorError, match="build a new one inside the event loop that uses it"):
        anyio.run(take_one, backend=backend)  # a second loop is told at once, never left waiting


def _end(loop: asyncio.AbstractEventLoop) -> None:
    """Ends a loop as asyncio.run() does: its tasks cancelled and awaited, then closed."""

    async def cancel_all(tasks: set[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    loop.run_until_complete(cancel_all(asyncio.all_tasks(loop)))
    loop.close()


@pytest.mark.parametrize("kind", KINDS)
def test_another_event_loop_is_refused_at_once_and_its_shutdown_is_done_by_the_collectors_loop(kind: str) -> None:
    before = ResourceSnapshot.take()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="owner-loop", daemon=True)
    thread.start()
    collector = make(kind, counting)
    try:
        asyncio.run_coroutine_threadsafe(anext(collector), loop).result(60)

        async def elsewhere() -> None:
            with anyio.fail_after(10):
                with pytest.raises(CollectorStateError, match="belongs to the event loop it started on"):
                    await anext(collector)
                with pytest.raises(CollectorStateError, match="belongs to the event loop it started on"):
                    async with collector.pause():
                        pass
                await collector.async_shutdown()  # handed to the collector's own loop, and waited for
            assert collector.state is CollectorState.CLOSED

        asyncio.run(elsewhere())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        _end(loop)
    assert_no_leaks(before, timeout=5.0)


@pytest.mark.parametrize("kind", ["Collector", "MultiSync", "Batched"])
def test_a_collector_whose_loop_stopped_is_refused_then_released_without_waiting(kind: str) -> None:
    before = ResourceSnapshot.take()
    loop = asyncio.new_event_loop()
    collector = make(kind, counting)
    try:
        loop.run_until_complete(anext(collector))  # the loop stops with the collector's tasks waiting in it

        async def elsewhere() -> None:
            with anyio.fail_after(10):
                with pytest.raises(CollectorStateError, match="belongs to the event loop it started on"):
                    async with collector:  # its failed entry shuts it down: released without waiting
                        pass
            assert collector.state is CollectorState.CLOSED

        asyncio.run(elsewhere())
        assert_no_leaks(before, timeout=5.0)
    finally:
        _end(loop)


@pytest.mark.parametrize("kind", ["Collector", "MultiSync", "Batched"])
def test_a_collector_dropped_without_shutdown_is_released_at_its_loops_end_and_warns(kind: str) -> None:
    before = ResourceSnapshot.take()

    async def drop() -> None:
        collector = make(kind, counting)
        with anyio.fail_after(60):
            await anext(collector)
        del collector  # its own tasks still hold it: it is released when they end, with the loop

    with pytest.warns(ResourceWarning, match="never shut down: the event loop it started on ended"):
        asyncio.run(drop())
    collecting = threading.Thread(target=gc.collect, name="gc")  # and collecting it never blocks
    collecting.start()
    collecting.join(10)
    assert not collecting.is_alive(), "a finalizer blocked"
    assert_no_leaks(before, timeout=5.0)


_PROGRAM_PREAMBLE = """
import asyncio, functools, gc, warnings
from acollect import MultiSyncCollector
from acollect.envs import GymEnv
warnings.simplefilter("error")  # nothing may warn: a collector that ends its total_frames closed itself
def collector(total):
    return MultiSyncCollector([functools.partial(GymEnv, "CartPole-v1", num_envs=4)] * 2, frames_per_batch=128,
                              total_frames=total, start_method="forkserver")
"""


def _run_program(body: str) -> subprocess.CompletedProcess[str]:
    """Runs a program in a fresh interpreter, under a deadline: a hang fails here, never the suite."""
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM_PREAMBLE + textwrap.dedent(body)],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def test_a_program_iterating_without_async_with_ends_after_a_garbage_collection() -> None:
    done = _run_program("""
        async def main():
            c = collector(512)
            async for b in c:
                pass
            print(c.state.name)
        asyncio.run(main()); junk = [[i] for i in range(3_000_000)]; gc.collect()
        print("ended")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CLOSED", "ended"]


def test_a_program_reusing_a_collector_under_a_second_event_loop_is_told_at_once() -> None:
    done = _run_program("""
        warnings.simplefilter("ignore", ResourceWarning)  # the first loop ends with it open: warned, and released
        c = collector(5120)
        async def one():
            async for b in c:
                break
        async def two():
            async with c:
                async for b in c:
                    break
        asyncio.run(one())
        try:
            asyncio.run(two())
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ClosedCollectorError: cannot enter the collector"), done.stdout
    assert "the event loop it started on ended" in done.stdout
