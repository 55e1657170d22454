"""Where the time goes: ``stats().time_split``, ``worker_time_split`` and ``bottleneck`` on every collector class.

Each workload is made slow in one place only (the env, the policy, the inference server or the consumer), by a
sleep of tens of milliseconds that frees the core: the part it lands in outweighs every other by far, whatever
else the machine is doing, and the tests assert that ordering, never a share or a duration. The waits for a core
are made by pinning busy threads to one core together (Linux only), the pause by ``pause()``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, Collector, MultiAsyncCollector, MultiSyncCollector, ReplayBuffer
from acollect._affinity import TrainerPin, can_pin, usable_cores
from acollect._time_split import (
    CPU_WAIT,
    ENV,
    OTHER,
    PARTS,
    POLICY,
    TRAINER,
    Stopwatch,
    TimeSplitWindow,
    _charge_wait,
    bottleneck,
    read_schedstat,
)
from acollect.stats import CollectorStats, StatsRecorder
from acollect.testing import CountingEnv, SlowEnv, wait_until

START_METHOD = "forkserver"  # workers forked from one process that imported everything once: quick to start
STEP_SLEEP = 0.02  # per step: long beside any step, policy call or wake-up on a busy machine

needs_schedstat = pytest.mark.skipif(
    read_schedstat() is None, reason="the kernel does not count threads' waits for a core here"
)
needs_pinning = pytest.mark.skipif(not can_pin(), reason="this platform cannot pin threads to cores")


class Sleepy(torch.nn.Module):
    """Acts 0 after sleeping ``seconds`` per call: a policy that costs time and frees the core meanwhile."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


class BusyEnv(CountingEnv):
    """A :class:`CountingEnv` whose every step keeps its thread busy for ``cpu_s`` seconds of CPU time: it wants a
    core the whole time, so a thread beside it on the same core makes it wait for one."""

    def __init__(self, cpu_s: float, num_envs: int = 1) -> None:
        super().__init__(num_envs)
        self.cpu_s = cpu_s

    def _before_step(self) -> None:
        _burn(self.cpu_s)


def _burn(cpu_s: float) -> None:
    """Keeps this thread on a core until it used ``cpu_s`` seconds of CPU time (however long others hold it)."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


def _policy(seconds: float = 0.0) -> TensorDictModule:
    return TensorDictModule(Sleepy(seconds), in_keys=["observation"], out_keys=["action"])


def _build(
    kind: type, env: Any, policy: Any, frames_per_batch: int, total_frames: int, workers: int = 2, **options: Any
) -> Any:
    if kind is Collector:
        return Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames, **options)
    if kind is AsyncBatchedCollector:
        policy = policy if policy is not None else _policy()
        options["max_wait"] = 0.001
    return kind(
        [env] * workers,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        start_method=START_METHOD,
        **options,
    )


async def _run(collector: Any, *, consumer_sleep: float = 0.0, consumer_cpu: float = 0.0) -> CollectorStats:
    async with collector:
        with anyio.fail_after(120):
            async for _ in collector:
                if consumer_sleep:
                    await anyio.sleep(consumer_sleep)
                if consumer_cpu:
                    _burn(consumer_cpu)  # a trainer's step: the event loop's thread on a core all along
            return collector.stats()  # type: ignore[no-any-return]


def _check_shape(stats: CollectorStats, workers: int) -> None:
    assert set(stats.time_split) in (set(PARTS), set(PARTS) - {"cpu_wait"})  # no "cpu_wait" where not counted
    assert sum(stats.time_split.values()) == pytest.approx(1.0)
    assert sorted(stats.worker_time_split) == list(range(workers))
    for split in stats.worker_time_split.values():
        assert sum(split.values()) == pytest.approx(1.0)


def _largest(split: dict[str, float]) -> str:
    return max(split, key=split.__getitem__)


KINDS = [Collector, MultiSyncCollector, MultiAsyncCollector, AsyncBatchedCollector]


# -- one slow place, named -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
async def test_a_slow_env_is_named_the_bottleneck(kind: type) -> None:
    env = functools.partial(SlowEnv, STEP_SLEEP, num_envs=2)
    stats = await _run(_build(kind, env, None, frames_per_batch=8, total_frames=8 * 15))
    _check_shape(stats, 1 if kind is Collector else 2)
    assert _largest(stats.time_split) == "env", stats.time_split
    assert stats.bottleneck == "env", stats.time_split
    assert "bound by env stepping" in stats.describe()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_consumer_that_sleeps_between_batches_is_named_the_bottleneck(kind: type) -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    # 16 batches: with batches ahead, the first ones wait on nobody, and the waits a worker reports must still
    # add up to the half-second of collecting time a bottleneck needs, however loaded the machine.
    collector = _build(kind, env, None, frames_per_batch=16, total_frames=16 * 16)
    stats = await _run(collector, consumer_sleep=0.1)
    _check_shape(stats, 1 if kind is Collector else 2)
    assert _largest(stats.time_split) == "trainer", stats.time_split
    assert stats.bottleneck == "trainer", stats.time_split
    assert "bound by the trainer" in stats.describe()


@pytest.mark.parametrize("kind", [Collector, MultiAsyncCollector])
async def test_a_slow_policy_where_the_envs_run_is_named_the_bottleneck(kind: type) -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    stats = await _run(_build(kind, env, _policy(STEP_SLEEP), frames_per_batch=8, total_frames=8 * 15))
    assert stats.time_split["policy"] > stats.time_split["env"], stats.time_split
    assert stats.bottleneck == "policy", stats.time_split


async def test_a_sleeping_server_policy_is_named_the_bottleneck() -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    collector = _build(AsyncBatchedCollector, env, _policy(STEP_SLEEP), frames_per_batch=8, total_frames=8 * 15)
    stats = await _run(collector)
    _check_shape(stats, 2)
    assert _largest(stats.time_split) == "actions", stats.time_split
    assert stats.bottleneck == "inference", stats.time_split
    assert "bound by waiting for the inference server" in stats.describe()


async def test_no_bottleneck_is_named_before_anything_was_measured() -> None:
    collector = Collector(CountingEnv, frames_per_batch=8, total_frames=8)
    assert collector.stats().bottleneck is None
    assert collector.stats().time_split == dict.fromkeys(PARTS, 0.0)


async def test_the_server_says_where_its_own_time_goes() -> None:
    # A pass that sleeps per call and fast envs: the server's loop spends its time in passes.
    env = functools.partial(CountingEnv, num_envs=2)
    collector = _build(AsyncBatchedCollector, env, _policy(STEP_SLEEP), frames_per_batch=8, total_frames=8 * 15)
    stats = await _run(collector)
    assert stats.inference is not None
    split = stats.inference["time_split"]
    assert set(split) == {"pass", "gathering", "idle"}
    assert sum(split.values()) == pytest.approx(1.0)
    assert _largest(split) == "pass", split


# -- the wait for a core ---------------------------------------------------------------------------
@needs_schedstat
def test_the_schedstat_reader_reads_this_threads_counts() -> None:
    on_core, waited = read_schedstat() or (0, 0)
    _burn(0.02)
    after = read_schedstat()
    assert after is not None
    assert after[0] > on_core  # the kernel counted the CPU time just used
    assert after[1] >= waited  # and the wait for a core never goes back


def test_a_stopwatch_takes_the_wait_from_the_parts_it_ran_in() -> None:
    spent = [3.0, 1.0, 0.0, 4.0, 0.0, 0.0]  # env, policy, actions, trainer, cpu_wait, other
    _charge_wait(spent, 2.0)
    assert spent[CPU_WAIT] == 2.0
    assert spent[ENV] == pytest.approx(1.5)
    assert spent[POLICY] == pytest.approx(0.5)
    assert spent[TRAINER] == 4.0  # the thread slept there: untouched while the running parts cover the wait
    assert sum(spent) == pytest.approx(8.0)
    spent = [1.0, 0.0, 0.0, 4.0, 0.0, 0.0]
    _charge_wait(spent, 3.0)  # more than it ran: the rest was a wake-up without a free core
    assert (spent[ENV], spent[TRAINER], spent[CPU_WAIT]) == (0.0, 2.0, 3.0)


def test_a_stopwatch_reports_the_wait_as_unknown_where_the_kernel_does_not_count_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import acollect._time_split as time_split

    monkeypatch.setattr(time_split, "read_schedstat", lambda: None)
    watch = Stopwatch()
    watch.switch(ENV)
    watch.switch(OTHER)
    spent = watch.take()
    assert math.isnan(spent[CPU_WAIT])
    assert spent[ENV] >= 0
    window = TimeSplitWindow()
    window.add(0, spent)
    assert "cpu_wait" not in window.split()  # absent, not 0: nobody knows


def test_a_large_wait_for_cores_outweighs_stepping_and_says_whose_cores() -> None:
    split = {"env": 0.5, "policy": 0.1, "actions": 0.0, "trainer": 0.1, "cpu_wait": 0.3, "other": 0.0}
    assert bottleneck(split) == "cpu"
    assert bottleneck(split, trainer_cores=1.0) == "trainer_cpu"
    assert bottleneck({**split, "trainer": 0.6, "env": 0.0}) == "trainer"  # the trainer would stay the limit
    assert bottleneck({**split, "cpu_wait": 0.05, "env": 0.75}) == "env"


def test_a_pause_is_taken_out_of_the_trainers_part() -> None:
    rec = StatsRecorder()
    rec.record_worker(0, 8, 0, now=1.0, time_spent=[1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    rec.pause(now=2.0)
    rec.resume(now=22.0)
    # The worker's stopwatch charged the 20 s pause to the trainer; the collector takes them out.
    rec.record_worker(0, 8, 0, now=23.0, time_spent=[1.0, 0.0, 0.0, 20.5, 0.0, 0.0])
    snap = rec.snapshot(frames=16, batches=2, policy_version=0, now=23.0)
    assert snap.time_split["trainer"] < snap.time_split["env"]
    assert snap.bottleneck == "env"


@contextlib.contextmanager
def _pinned(cores: tuple[int, ...]) -> Iterator[None]:
    """This process (every thread: the event loop's, the collection threads) on ``cores`` until the block exits."""
    pin = TrainerPin(cores)
    pin.pin()
    try:
        yield
    finally:
        pin.restore()


@contextlib.contextmanager
def _busy_process(core: int) -> Iterator[None]:
    """Another process spinning on ``core`` until the block exits (another job on the machine)."""
    code = f"import os, time\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        process.kill()
        process.wait(timeout=10)


@needs_schedstat
@needs_pinning
async def test_workers_sharing_a_core_are_named_cpu_contention_not_the_policy() -> None:
    core = usable_cores()[-1]
    env = functools.partial(BusyEnv, 0.002, num_envs=2)  # never sleeps: both workers want the one core
    collector = _build(
        MultiSyncCollector, env, None, frames_per_batch=16, total_frames=16 * 20, worker_affinity=[{core}, {core}]
    )
    stats = await _run(collector)
    assert all(split["cpu_wait"] > 0 for split in stats.worker_time_split.values()), stats.worker_time_split
    assert stats.time_split["cpu_wait"] > stats.time_split["policy"], stats.time_split
    assert stats.bottleneck == "cpu", (stats.time_split, stats.trainer_cores)
    assert "bound by CPU contention" in stats.describe()


@needs_schedstat
@needs_pinning
async def test_the_in_process_thread_waiting_for_a_core_is_named_cpu_contention() -> None:
    core = usable_cores()[-1]
    env = functools.partial(BusyEnv, 0.002, num_envs=2)
    with _busy_process(core), _pinned((core,)):
        stats = await _run(Collector(env, frames_per_batch=16, total_frames=16 * 20))
    assert stats.time_split["cpu_wait"] > stats.time_split["policy"], stats.time_split
    assert stats.bottleneck == "cpu", (stats.time_split, stats.trainer_cores)


@needs_schedstat
@needs_pinning
async def test_a_trainer_whose_cpu_starves_the_worker_is_named() -> None:
    # One core for the worker and the trainer, and each batch costs both about the same CPU time: while the trainer
    # works on a batch, the worker, collecting the next one, waits for the core (or, where the trainer is the slower,
    # for the trainer). Either way the trainer is named, never the env or the policy.
    core = usable_cores()[-1]
    env = functools.partial(BusyEnv, 0.002, num_envs=2)  # 8 steps a batch: 16 ms of CPU
    collector = _build(
        MultiSyncCollector, env, None, frames_per_batch=16, total_frames=16 * 25, workers=1, worker_affinity=[{core}]
    )
    with _pinned((core,)):
        stats = await _run(collector, consumer_cpu=0.016)
    assert stats.trainer_cores is not None
    assert stats.bottleneck in ("trainer_cpu", "trainer"), (stats.time_split, stats.trainer_cores)
    assert "bound by the trainer" in stats.describe()


# -- a pause -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [Collector, MultiSyncCollector])
async def test_stats_and_progress_say_paused_and_the_rate_falls_to_0(
    kind: type, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="acollect.progress")
    env = functools.partial(CountingEnv, num_envs=2)
    async with _build(kind, env, None, frames_per_batch=16, total_frames=-1, progress="log") as collector:
        for _ in range(5):
            await anext(collector)
        assert collector.stats().frames_per_s > 0
        async with collector.pause():
            stats = collector.stats()
            assert stats.paused
            assert stats.frames_per_s == 0.0
            assert set(stats.worker_frames_per_s.values()) == {0.0}
            assert stats.bottleneck is None
            assert stats.describe().endswith(", paused")
            assert "paused" in caplog.records[-1].getMessage()  # said at once: no batch comes to say it
        assert not collector.stats().paused
        for _ in range(3):
            await anext(collector)
        assert collector.stats().frames_per_s > 0  # measured afresh from the pause's end


@pytest.mark.parametrize("kind", [Collector, MultiSyncCollector])
async def test_a_paused_background_collector_says_so(kind: type) -> None:
    env = functools.partial(CountingEnv, num_envs=2)
    async with _build(kind, env, None, frames_per_batch=16, total_frames=-1) as collector:
        collector.start(replay_buffer=ReplayBuffer(10_000))
        await wait_until(lambda: collector.stats().batches >= 3, timeout=60)
        async with collector.pause():
            stats = collector.stats()
            assert stats.paused
            assert stats.frames_per_s == 0.0
        await wait_until(lambda: collector.stats().frames_per_s > 0, timeout=60)  # measured afresh after it
