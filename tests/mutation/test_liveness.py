"""Worker restarts and liveness (:mod:`acollect._workers.handles`, :mod:`acollect._workers.liveness`): what a worker
slot counts at each event, and what the liveness loop does with a dead, silent, hung or never-started worker.

Each test kills mutants that ``tools/mutation.py liveness`` found alive: a restart not counted, a batch dropped
with a dead worker counted twice or not at all, a replayed batch taken, a heartbeat that hides a hang, a death
that fails the pool where it should restart the worker.
The liveness loop runs for real over real processes (``sleep``), which the tests kill or leave silent.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from acollect._batches.slot_ring import CREDIT, CreditPipe, CreditPipeWriter, ShmSlotRing
from acollect._runtime.endpoint import Endpoint
from acollect._runtime.wire import encode_tensordict, unpack_message
from acollect._runtime.worker_socket import WorkerSocket
from acollect._workers import protocol as P
from acollect._workers.handles import CollectRequest, Rejected, WorkerHandle, WorkerMode, WorkerState, parse_identity
from acollect._workers.liveness import Monitor
from acollect._workers.pool_events import Counters, PoolEvents
from acollect._workers.pool_settings import PoolSettings
from acollect.errors import ProtocolError, WorkerCrashedError, WorkerTimeoutError
from acollect.launchers import Launcher, LocalLauncher
from acollect.testing import our_segments

DEADLINE = 30.0  # only a hang reaches it


def config(index: int = 0, **fields: Any) -> P.WorkerConfig:
    return P.WorkerConfig(index=index, generation=0, n_workers=2, address="", parent_pid=0,
                          **fields)  # fmt: skip


def hello(n_envs: int = 2, **fields: Any) -> dict[str, Any]:
    leaves = [{"nbytes": 24}, {"nbytes": 16}]
    return {"n_envs": n_envs, "layout": {"leaves": leaves}, **fields}


def ready(index: int = 0, now: float = 0.0) -> WorkerHandle:
    handle = WorkerHandle(index, config(index))
    handle.on_launch(now=now)
    handle.on_hello(hello())
    handle.on_greeted(now=now)
    return handle


def batch(seq: object, **fields: Any) -> dict[str, Any]:
    """A batch's header; its counters follow its number."""
    n = seq if isinstance(seq, int) else 0
    return {"kind": P.BATCH, "seq": seq, "traj_counter": 10 + n, "frames": 100 * (n + 1), **fields}


DATA = TensorDict({"x": torch.zeros(2)}, batch_size=[2])


def test_an_identity_names_a_worker_and_its_generation() -> None:
    assert parse_identity(b"w3.7") == (3, 7)
    assert parse_identity(b"w12.0d") == (12, 0)
    assert parse_identity(P.worker_identity(5, 2)) == (5, 2)
    for other in (b"w3", b"x3.7", b"w3.7e", b"w1234567890.1", b"w-1.2"):
        assert parse_identity(other) is None


def test_a_request_says_its_batch_and_slot() -> None:
    assert CollectRequest(4).fields() == {"n": 4}
    assert CollectRequest(4, slot=0).fields() == {"n": 4, "slot": 0}
    assert CollectRequest(4, slot=2, ahead=True).fields() == {"n": 4, "slot": 2}


def test_each_launch_is_a_new_incarnation_that_forgets_the_last() -> None:
    handle = ready(now=1.0)
    assert (handle.state, handle.generation, handle.started_at, handle.ready) == (WorkerState.READY, 1, 1.0, True)
    assert handle.identity == b"w0.1"
    assert (
        handle.hello.n_envs,
        handle.hello.batch_nbytes,
        handle.hello.weights_structure,
        handle.hello.env_seed,
    ) == (2, 40, None, None)
    handle.commands.on_send(P.WEIGHTS)
    handle.commands.on_send(P.SEED)
    handle.commands.on_send(P.COLLECT)
    assert (handle.commands.changes_sent, handle.commands.resets_sent) == (2, 1)
    handle.lockstep.on_ask(CollectRequest(1, ahead=True))
    handle.on_beat({"steps": 5, "busy": True, "discarded": 4, "sent": 2}, now=2.0)
    handle.heartbeats.on_env_restarts(3)
    handle.on_unreachable(now=3.0)
    assert handle.on_death(lockstep=True, running=False) == 1
    handle.on_launch(now=4.0)
    assert (handle.generation, handle.started_at, handle.restarts) == (2, 4.0, 1)
    assert (
        handle.commands.changes_sent,
        handle.commands.resets_sent,
        handle.batches.sent,
        handle.batches.next_seq,
    ) == (0, 0, 0, 0)
    assert (
        handle.heartbeats.last_steps,
        handle.heartbeats.busy,
        handle.heartbeats.partial,
        handle.batches.missing_since,
    ) == (-1, False, False, None)
    assert handle.unreachable_since is None
    assert [r.ahead for r in handle.lockstep.requests] == [False]  # asked again of the successor
    assert handle.on_beat({"steps": 0, "busy": False, "discarded": 1}, now=5.0) == 1  # a fresh count
    assert handle.heartbeats.on_env_restarts(1) == 1


def test_a_hello_says_what_the_worker_built() -> None:
    handle = WorkerHandle(0, config())
    handle.on_launch(now=0.0)
    handle.memory.make_credit_pipe("/tmp/acollect-test-pipe-that-is-never-made")
    handle.on_hello(hello(n_envs=3, weights=[[["w"], [2], "float32"]], env_seed="7",
                          pipe="/tmp/acollect-test-pipe-that-is-never-made"))  # fmt: skip
    assert (handle.hello.n_envs, handle.hello.batch_nbytes, handle.hello.env_seed) == (3, 40, 7)
    assert handle.hello.weights_structure == {("w",): ((2,), torch.float32)}
    assert handle.memory.pipe_path == "/tmp/acollect-test-pipe-that-is-never-made"
    assert handle.hello.layout == hello()["layout"]
    other = WorkerHandle(1, config(1))
    other.on_launch(now=0.0)
    other.memory.make_credit_pipe("/tmp/a")
    other.on_hello(hello(pipe="/tmp/b"))
    assert other.memory.pipe_path is None  # a worker never makes the collector open a path it did not name


def test_a_heartbeat_tells_progress_a_held_batch_and_a_missing_one() -> None:
    handle = ready(now=0.0)
    assert (
        handle.heartbeats.last_beat,
        handle.heartbeats.last_progress,
        handle.heartbeats.last_steps,
    ) == (0.0, 0.0, -1)
    assert handle.on_beat({"steps": 4, "busy": True}, now=1.0) == 0
    assert (
        handle.heartbeats.last_steps,
        handle.heartbeats.last_progress,
        handle.heartbeats.busy,
        handle.heartbeats.partial,
    ) == (4, 1.0, True, True)
    handle.on_beat({"steps": 4, "busy": True}, now=2.0)
    assert handle.heartbeats.last_progress == 1.0  # no step since: a hang shows
    handle.on_beat({"steps": 4, "busy": False, "partial": True}, now=3.0)
    assert (handle.heartbeats.busy, handle.heartbeats.partial, handle.heartbeats.last_progress) == (False, True, 1.0)
    handle.on_beat({"steps": 4, "busy": True}, now=4.0)
    assert handle.heartbeats.last_progress == 4.0  # a batch begun is progress
    handle.on_beat({"steps": 4, "busy": False, "partial": False}, now=5.0)
    assert (handle.heartbeats.busy, handle.heartbeats.partial) == (False, False)
    assert handle.on_beat({"steps": 9, "busy": False, "discarded": 6}, now=6.0) == 6
    assert handle.on_beat({"steps": 9, "busy": False, "discarded": 6}, now=7.0) == 0
    assert handle.on_beat({"steps": 9, "busy": False, "discarded": 5}, now=8.0) == 0  # reordered: never negative
    assert handle.on_beat({"steps": 9, "busy": False, "discarded": 8}, now=9.0) == 2
    handle.on_beat({"steps": 9, "busy": False, "sent": 1}, now=10.0)
    assert (handle.batches.sent, handle.batches.missing_since) == (1, 10.0)
    handle.on_beat({"steps": 9, "busy": False, "sent": 1}, now=11.0)
    assert handle.batches.missing_since == 10.0
    handle.on_batch(batch(0), DATA, lockstep=False)
    assert handle.batches.missing_since is None
    handle.on_beat({"steps": 9, "busy": False, "sent": 1}, now=12.0)
    assert handle.batches.missing_since is None
    handle.heartbeats.on_message(now=13.0)
    assert handle.heartbeats.last_beat == 13.0


def test_env_restarts_count_once_each_and_refuse_nonsense() -> None:
    handle = ready()
    assert handle.heartbeats.on_env_restarts(2) == 2
    assert handle.heartbeats.on_env_restarts(2) == 0
    assert handle.heartbeats.on_env_restarts(1) == 0
    assert handle.heartbeats.on_env_restarts(5) == 3
    for bad in (-1, "3", 1.0, None):
        with pytest.raises(ProtocolError, match=rf"^worker 0 sent env_restarts={bad!r}: expected an int >= 0$"):
            handle.heartbeats.on_env_restarts(bad)


def test_batches_arrive_in_order_once_each() -> None:
    handle = ready()
    item = handle.on_batch(batch(0), DATA, lockstep=False)
    assert (item.worker, item.generation, item.in_slot, item.nbytes, item.request) == (0, 1, False, 40, None)
    assert item.data is DATA
    assert (
        handle.batches.next_seq,
        handle.batches.traj_counter,
        handle.batches.frames,
        handle.lockstep.inbox,
    ) == (1, 10, 100, ())
    with pytest.raises(Rejected, match=r"^replayed batch: seq 0 from worker 0, expected 1$"):
        handle.on_batch(batch(0), DATA, lockstep=False)
    with pytest.raises(ProtocolError, match=r"^worker 0 sent batch 2 after 0: batches lost$"):
        handle.on_batch(batch(2), DATA, lockstep=False)
    with pytest.raises(ProtocolError, match=r"^worker 0 sent a batch with seq='1', expected an int$"):
        handle.on_batch(batch("1"), DATA, lockstep=False)
    with pytest.raises(ProtocolError, match=r"^worker 0 sent a batch with neither slot nor tensors$"):
        handle.on_batch(batch(1), None, lockstep=False)
    with pytest.raises(ProtocolError, match=r"^worker 0 named slot 0, which it does not have$"):
        handle.on_batch(batch(1, slot=0), None, lockstep=False)
    assert handle.batches.next_seq == 1
    handle.batches.restore_counters(traj_counter=50, frames=500)
    assert (handle.batches.traj_counter, handle.batches.frames) == (50, 500)


def test_lockstep_parts_answer_their_requests_in_order() -> None:
    handle = ready()
    with pytest.raises(ProtocolError, match=r"^worker 0 sent a batch nobody asked for$"):
        handle.on_batch(batch(0), DATA, lockstep=True)
    handle.lockstep.on_ask(CollectRequest(1))
    handle.lockstep.on_ask(CollectRequest(2, ahead=True))
    assert (
        handle.lockstep.outstanding,
        handle.lockstep.asked(1),
        handle.lockstep.asked(2),
        handle.lockstep.asked(3),
    ) == (2, True, True, False)
    with pytest.raises(ProtocolError, match=r"^worker 0 answered collect n=2, asked for n=1$"):
        handle.on_batch(batch(0, n=2), DATA, lockstep=True)
    first = handle.on_batch(batch(0, n=1), DATA, lockstep=True)
    second = handle.on_batch(batch(1), DATA, lockstep=True)  # no n: the oldest request
    assert (first.request.number, second.request.number) == (1, 2)  # type: ignore[union-attr]
    assert (
        handle.lockstep.outstanding,
        handle.lockstep.asked(1),
        handle.lockstep.part(1) is first,
        handle.lockstep.part(3),
    ) == (0, True, True, None)
    assert handle.lockstep.take_part(2) is second
    assert handle.lockstep.inbox == (first,)
    with pytest.raises(AssertionError, match=r"^worker 0 has no part of batch 2"):
        handle.lockstep.take_part(2)


@pytest.mark.parametrize(("running", "busy", "requests", "lost"), [
    (True, True, 0, 1), (True, False, 0, 0), (False, True, 0, 0), (False, False, 1, 1),
])  # fmt: skip
def test_an_asynchronous_worker_dies_with_the_batch_it_was_collecting(
    running: bool, busy: bool, requests: int, lost: int
) -> None:
    handle = ready()
    handle.on_batch(batch(0), DATA, lockstep=False)
    handle.on_beat({"steps": 1, "busy": busy, "sent": 3}, now=1.0)
    for number in range(requests):
        handle.lockstep.on_ask(CollectRequest(number))
    assert handle.on_death(lockstep=False, running=running) == lost
    assert handle.restarts == 1
    generation = handle.generation
    handle.on_launch(now=2.0)
    # its batches still on their way: each counted as dropped once, except the one counted at its death
    assert handle.batches.on_late(generation, batch(0)) is False  # received already
    assert handle.batches.on_late(generation, batch(1)) is True
    assert handle.batches.on_late(generation, batch(1)) is False  # a replay
    assert handle.batches.on_late(generation, batch(3)) is (not (running and busy))
    assert handle.batches.on_late(generation, batch(4)) is True
    assert handle.batches.on_late(generation + 1, batch(5)) is False  # not the dead incarnation
    assert handle.batches.on_late(generation, {"kind": P.HEARTBEAT, "seq": 6}) is False
    assert handle.batches.on_late(generation, batch("7")) is False


def test_a_lockstep_worker_dies_with_every_part_it_was_asked_for() -> None:
    handle = ready()
    handle.lockstep.on_ask(CollectRequest(1))
    handle.lockstep.on_ask(CollectRequest(2))
    generation = handle.generation
    assert handle.on_death(lockstep=True, running=False) == 2
    assert handle.lockstep.outstanding == 2  # asked again of its successor
    assert handle.batches.on_late(generation, batch(0)) is False  # counted with its request
    assert handle.on_death(lockstep=True, running=False) == 2
    assert handle.restarts == 2


def test_a_lost_worker_is_dropped_with_what_it_held() -> None:
    handle = ready()
    handle.lockstep.on_ask(CollectRequest(1))
    handle.lockstep.on_ask(CollectRequest(2))
    handle.on_batch(batch(0), DATA, lockstep=True)
    assert handle.on_lost(lockstep=True, running=False) == 1
    assert (handle.state, handle.lost, handle.lockstep.outstanding, handle.lockstep.inbox, handle.restarts) == (
        WorkerState.LOST, True, 0, (), 0
    )  # fmt: skip
    other = ready(1)
    other.on_beat({"steps": 1, "busy": True, "sent": 0}, now=1.0)
    generation = other.generation
    assert other.on_lost(lockstep=False, running=True) == 1
    assert other.batches.on_late(generation, batch(0)) is False  # the one it was collecting: counted already
    assert other.batches.on_late(generation, batch(1)) is True
    assert handle.batches.on_late(handle.generation, batch(0)) is False  # lockstep: counted with its requests
    idle = ready(2)
    idle.on_beat({"steps": 1, "busy": False, "sent": 2}, now=1.0)
    assert idle.on_lost(lockstep=False, running=True) == 0
    assert [idle.batches.on_late(idle.generation, batch(seq)) for seq in range(3)] == [True, True, True]


def test_unreachable_once_then_dead_or_stopping() -> None:
    handle = ready()
    assert handle.on_unreachable(now=1.0) is True
    assert handle.on_unreachable(now=2.0) is False
    assert (handle.state, handle.unreachable_since) == (WorkerState.UNREACHABLE, 1.0)
    handle.on_dead()
    assert handle.state is WorkerState.DEAD
    handle.on_stopping()
    handle.on_stopping()
    handle.on_dead()
    assert handle.state is WorkerState.STOPPING
    handle.release()
    handle.release()
    assert "STOPPING" in repr(handle)


def test_a_slot_for_a_hand_started_worker_waits_joins_and_fails_to_join() -> None:
    handle = WorkerHandle(0, config(remote=True))
    assert handle.joined is False
    handle.on_vacate(now=1.0)
    assert (handle.state, handle.generation, handle.joined, handle.started_at) == (WorkerState.VACANT, 1, False, 1.0)
    handle.on_join(now=2.0)
    assert (handle.state, handle.started_at, handle.joined, handle.generation) == (WorkerState.STARTING, 2.0, True, 1)
    handle.on_join_failed()
    assert handle.state is WorkerState.VACANT


# -- the liveness loop over real processes --------------------------------------------------------------------------
#: A process that holds memory, as a worker does (torch, its envs): killed, it takes a few milliseconds to exit.
HEAVY = (sys.executable, "-c", "import time; held = bytearray(64 << 20); print(flush=True); time.sleep(60)")


class OsProcess:
    """A worker process as a launcher reports it: here a real ``sleep`` the test kills or leaves running (or a
    :data:`HEAVY` one, returned once it holds its memory)."""

    def __init__(self, heavy: bool = False) -> None:
        if heavy:
            self.popen = subprocess.Popen(HEAVY, stdout=subprocess.PIPE)
            assert self.popen.stdout is not None
            self.popen.stdout.readline()
            self.popen.stdout.close()
        else:
            self.popen = subprocess.Popen(["sleep", "60"])

    @property
    def pid(self) -> int | None:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def write_config(self) -> None:
        pass

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()

    def close(self) -> None:
        pass  # as the launcher's own: a process killed a moment ago is reaped once it exited, never waited for here

    def describe(self) -> str:
        return f"pid {self.popen.pid}"


class Pool:
    """What the liveness loop is given: handles of live processes, the pool's events and counts, and how it starts
    a worker again (a new process, greeted at once)."""

    def __init__(self, n: int, *, max_restarts: int, on_worker_loss: str = "raise", heartbeat_timeout: float = 60.0,
                 startup_timeout: float = 60.0, credits: int | None = 2, launcher: Launcher | None = None,
                 running: bool = True, heartbeat_interval: float = 1.0, heavy: bool = False) -> None:  # fmt: skip
        self.heavy = heavy
        self.handles = [WorkerHandle(i, config(i, heartbeat_interval=heartbeat_interval)) for i in range(n)]
        self.processes: list[OsProcess] = []
        now = time.monotonic()
        for handle in self.handles:
            handle.on_launch(now=now)
            handle.on_process(self.process())
            handle.on_hello(hello())
            handle.on_greeted(now=now)
        self.events = PoolEvents()
        self.events.starting()
        if running:  # else every worker is still to say hello: the pool starts
            self.events.running()
        self.counters = Counters()
        self.mode = WorkerMode(running=True)
        self.settings = PoolSettings(
            launcher=launcher or LocalLauncher(), address=None, keys=None, use_shared_memory=None, credits=credits,
            slots=None, shared_batches=None, heartbeat_timeout=heartbeat_timeout, startup_timeout=startup_timeout,
            max_restarts=max_restarts, on_worker_loss=on_worker_loss, weight_sync_schemes={},
        )  # fmt: skip
        self.spawned: list[int] = []
        self.exited_before_spawn: list[int | None] = []  # the exit code of the process replaced, as seen by then
        self.vacated: list[int] = []
        self.lost_calls = 0

    def process(self) -> OsProcess:
        self.processes.append(OsProcess(self.heavy))
        return self.processes[-1]

    async def spawn(self, handle: WorkerHandle) -> None:
        self.spawned.append(handle.index)
        previous = handle.process
        assert isinstance(previous, OsProcess)
        self.exited_before_spawn.append(previous.popen.returncode)  # set once something saw it exit: no new poll
        handle.on_launch(now=time.monotonic())
        handle.on_process(self.process())
        handle.on_hello(hello())
        handle.on_greeted(now=time.monotonic())
        self.events.notify()

    def lost(self) -> None:
        self.lost_calls += 1

    def vacate(self, handle: WorkerHandle) -> None:
        self.vacated.append(handle.index)

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.popen.wait()


@asynccontextmanager
async def monitoring(pool: Pool) -> AsyncIterator[Monitor]:
    async with Endpoint() as endpoint, anyio.create_task_group() as tg:
        monitor = Monitor(endpoint, pool.handles, pool.events, pool.counters, pool.mode, pool.settings,
                          spawn=pool.spawn, vacate=pool.vacate, lost=pool.lost)  # fmt: skip
        tg.start_soon(monitor.run)
        try:
            yield monitor
        finally:
            tg.cancel_scope.cancel()
            pool.close()


async def until(pool: Pool, predicate: Callable[[], object]) -> None:
    with anyio.fail_after(DEADLINE):
        while not predicate():
            await pool.events.wait(0.05)


async def test_a_dead_worker_is_restarted_and_the_batch_it_was_collecting_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = Pool(2, max_restarts=2)
    pool.handles[0].on_beat({"steps": 3, "busy": True}, now=time.monotonic())
    async with monitoring(pool) as monitor:
        pool.processes[0].kill()
        await until(pool, lambda: pool.spawned)
        assert pool.spawned == [0]
        assert (pool.handles[0].restarts, pool.handles[0].generation, pool.handles[1].restarts) == (1, 2, 0)
        assert pool.counters.dropped_batches == 1
        assert pool.events.failure is None
        assert pool.processes[0].exitcode is not None
        assert not monitor.stopped.is_set()
    assert monitor.stopped.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"worker 0 (pid {pool.processes[0].pid}) died: ")
    assert warnings[0].endswith("; restarting it (1/2)")


async def test_a_worker_dead_with_its_restarts_spent_fails_the_pool_naming_it() -> None:
    pool = Pool(2, max_restarts=0)
    async with monitoring(pool):
        pool.processes[1].kill()
        await until(pool, lambda: pool.events.failure)
    failure = pool.events.failure
    assert isinstance(failure, WorkerCrashedError)
    assert (failure.worker_id, failure.exitcode) == (1, -9)
    assert str(failure) == f"worker 1 (pid {pool.processes[1].pid}) died: killed by signal 9 (SIGKILL)"
    assert (pool.handles[1].state, pool.handles[0].state) == (WorkerState.DEAD, WorkerState.READY)
    assert pool.spawned == []
    assert pool.counters.dropped_batches == 0


async def test_elastic_a_worker_dead_with_its_restarts_spent_is_lost_and_the_others_go_on() -> None:
    pool = Pool(2, max_restarts=0, on_worker_loss="continue")
    pool.handles[0].on_beat({"steps": 3, "busy": True}, now=time.monotonic())
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.lost_calls)
        assert (pool.handles[0].state, pool.counters.lost_workers, pool.counters.dropped_batches) == (
            WorkerState.LOST, 1, 1
        )  # fmt: skip
        assert pool.events.failure is None
        pool.processes[1].kill()  # the last one left: the pool fails
        await until(pool, lambda: pool.events.failure)
    assert isinstance(pool.events.failure, WorkerCrashedError)
    assert (pool.lost_calls, pool.counters.lost_workers) == (1, 1)


def seconds_said(pattern: str, message: str) -> float:
    """The seconds a message says, where ``pattern`` (the message, its number as ``(\\d+\\.\\d)``) matches it whole."""
    match = re.match(pattern, message)
    assert match is not None, message
    return float(match.group(1))


async def test_a_silent_worker_is_timed_out_by_its_heartbeats() -> None:
    begun = time.monotonic()
    pool = Pool(1, max_restarts=0, heartbeat_timeout=0.3)
    async with monitoring(pool):
        await until(pool, lambda: pool.events.failure)
        assert pool.processes[0].popen.wait(timeout=DEADLINE) == -9  # the silent process is ended
    failure = pool.events.failure
    assert isinstance(failure, WorkerTimeoutError)
    assert failure.worker_id == 0
    silent = seconds_said(r"^worker 0 \(pid \d+\) sent no heartbeat for (\d+\.\d)s \(heartbeat_timeout=0\.3s\)$",
                          str(failure))  # fmt: skip
    assert 0.3 <= silent <= time.monotonic() - begun + 0.05  # its last word came after the test began


async def test_a_worker_that_steps_no_env_while_collecting_is_hung() -> None:
    begun = time.monotonic()
    pool = Pool(1, max_restarts=0, heartbeat_timeout=0.3)
    handle = pool.handles[0]
    handle.on_beat({"steps": 3, "busy": True}, now=time.monotonic())
    async with monitoring(pool):
        with anyio.fail_after(DEADLINE):
            while pool.events.failure is None:
                handle.heartbeats.on_message(now=time.monotonic())  # alive, but no step
                handle.on_beat({"steps": 3, "busy": True}, now=time.monotonic())
                await anyio.sleep(0.05)
    failure = pool.events.failure
    assert isinstance(failure, WorkerTimeoutError)
    assert failure.worker_id == 0
    stuck = seconds_said(r"^worker 0 \(pid \d+\) is hung: no env step for (\d+\.\d)s while collecting "
                         r"\(heartbeat_timeout=0\.3s\)$", str(failure))  # fmt: skip
    assert 0.3 <= stuck <= time.monotonic() - begun + 0.05  # its last step came after the test began


async def test_a_batch_announced_and_never_received_times_the_worker_out() -> None:
    pool = Pool(1, max_restarts=0, heartbeat_timeout=0.3)
    handle = pool.handles[0]
    async with monitoring(pool):
        with anyio.fail_after(DEADLINE):
            while pool.events.failure is None:
                handle.heartbeats.on_message(now=time.monotonic())
                handle.on_beat({"steps": 3, "busy": False, "sent": 1}, now=time.monotonic())
                await anyio.sleep(0.05)
    failure = pool.events.failure
    assert isinstance(failure, WorkerTimeoutError)
    assert failure.worker_id == 0
    assert re.match(r"^worker 0 \(pid \d+\) sent batch 0 more than heartbeat_timeout=0\.3s ago and it never arrived: "
                    "its connection to the collector dropped it$", str(failure))  # fmt: skip


async def test_a_worker_that_never_says_hello_did_not_start() -> None:
    pool = Pool(1, max_restarts=0, startup_timeout=0.3)
    handle = pool.handles[0]
    handle.on_launch(now=time.monotonic())
    handle.on_process(pool.process())
    async with monitoring(pool):
        await until(pool, lambda: pool.events.failure)
    assert isinstance(pool.events.failure, WorkerTimeoutError)
    assert re.match(r"^worker 0 \(pid \d+\) did not start within startup_timeout=0\.3s$", str(pool.events.failure))


async def test_an_unreachable_worker_counts_as_dead_after_a_grace() -> None:
    pool = Pool(1, max_restarts=0)
    async with monitoring(pool) as monitor:
        assert monitor.unreachable_grace == 1.0
        pool.handles[0].on_unreachable(now=time.monotonic())
        await until(pool, lambda: pool.events.failure)
    failure = pool.events.failure
    assert isinstance(failure, WorkerCrashedError)
    assert failure.worker_id == 0
    assert re.match(
        r"^worker 0 \(pid \d+\) cannot be reached: its connection to the collector is gone \(a message to it failed "
        r"\d\.\ds ago\)$",
        str(failure),
    ), str(failure)


async def loops(pool: Pool, n: int) -> None:
    """Waits until the liveness loop has gone round ``n`` more times (each round wakes the pool's waiters)."""
    with anyio.fail_after(DEADLINE):
        for _ in range(n):
            await pool.events.wait(DEADLINE)


async def test_within_their_deadlines_a_starting_worker_and_an_unreachable_one_wait() -> None:
    pool = Pool(3, max_restarts=1, startup_timeout=60.0)
    starting, unreachable = pool.handles[1], pool.handles[2]
    starting.on_launch(now=time.monotonic())  # launched a moment ago: no hello yet
    starting.on_process(pool.process())
    unreachable.on_unreachable(now=time.monotonic() + 3600)  # its grace runs for an hour
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.spawned)
        await loops(pool, 3)
        assert pool.spawned == [0]
        assert (starting.state, unreachable.state) == (WorkerState.STARTING, WorkerState.UNREACHABLE)
        assert pool.events.failure is None


async def test_elastic_each_worker_lost_is_counted_with_what_it_held(caplog: pytest.LogCaptureFixture) -> None:
    pool = Pool(3, max_restarts=0, on_worker_loss="continue")
    for handle in pool.handles:
        handle.on_beat({"steps": 3, "busy": True}, now=time.monotonic())
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.lost_calls == 1)
        pool.processes[2].kill()
        await until(pool, lambda: pool.lost_calls == 2)
        assert (pool.counters.lost_workers, pool.counters.dropped_batches) == (2, 2)
        assert pool.events.failure is None
    left = [r.getMessage() for r in caplog.records if "is lost" in r.getMessage()]
    assert [m.split(")")[0] for m in left] == [
        f"worker 0 (pid {pool.processes[0].pid}",
        f"worker 2 (pid {pool.processes[2].pid}",
    ]
    assert [m.split("collection goes on with the ")[1] for m in left] == [
        "2 workers left (on_worker_loss='continue')",
        "1 workers left (on_worker_loss='continue')",
    ]


async def test_elastic_a_lockstep_worker_lost_drops_every_part_it_was_asked_for() -> None:
    pool = Pool(2, max_restarts=0, on_worker_loss="continue", credits=None)
    pool.handles[0].lockstep.on_ask(CollectRequest(1))
    pool.handles[0].lockstep.on_ask(CollectRequest(2))
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.lost_calls)
    assert (pool.counters.dropped_batches, pool.handles[0].lockstep.outstanding) == (2, 0)


def test_batches_in_slots_name_a_slot_of_the_ring_and_a_successor_gets_fresh_ones() -> None:
    layout, _ = encode_tensordict(TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
    handle = ready()
    first = ShmSlotRing.create(layout, 2)
    handle.memory.use_ring(first)
    assert handle.memory.ring is first
    for seq, slot in enumerate([0, 1]):
        item = handle.on_batch(batch(seq, slot=slot), None, lockstep=False)
        assert (item.in_slot, item.header["slot"], item.nbytes) == (True, slot, 40)
        assert item.data["x"].data_ptr() == first[slot].tensordict["x"].data_ptr()
    assert handle.batches.next_seq == 2
    for bad in (2, -1, "0"):
        with pytest.raises(ProtocolError, match=r"^worker 0 named slot .*, which it does not have$"):
            handle.on_batch(batch(2, slot=bad), None, lockstep=False)
    handle.on_death(lockstep=False, running=False)
    handle.on_launch(now=1.0)
    handle.on_hello(hello())
    assert handle.memory.ring is None  # the predecessor's slots stay for its batches still queued
    second = ShmSlotRing.create(layout, 1)
    handle.memory.use_ring(second)
    handle.release()
    handle.release()
    assert handle.memory.ring is None
    assert not any(name in our_segments() for ring in (first, second) for name in ring.names)


def test_every_reset_sent_is_counted_and_zero_env_restarts_is_a_count() -> None:
    handle = ready()
    for kind in (P.SEED, P.LOAD_STATE, P.SEED):
        handle.commands.on_send(kind)
    assert (handle.commands.resets_sent, handle.commands.changes_sent) == (3, 3)
    assert handle.heartbeats.on_env_restarts(0) == 0


async def test_each_restart_of_a_lockstep_worker_drops_every_part_it_was_asked_for() -> None:
    pool = Pool(2, max_restarts=1, credits=None)
    for handle in pool.handles:
        handle.lockstep.on_ask(CollectRequest(1))
        handle.lockstep.on_ask(CollectRequest(2))
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.spawned == [0])
        pool.processes[1].kill()
        await until(pool, lambda: pool.spawned == [0, 1])
    assert pool.counters.dropped_batches == 4
    assert [h.lockstep.outstanding for h in pool.handles] == [2, 2]  # asked again of their successors


def test_a_new_slot_knows_nothing_yet() -> None:
    handle = WorkerHandle(3, config(3))
    assert (handle.state, handle.index, handle.process, handle.pid, handle.generation) == (WorkerState.NEW, 3, None,
                                                                                          None, 0)  # fmt: skip
    assert (
        handle.started_at,
        handle.restarts,
        handle.hello.n_envs,
        handle.hello.layout,
        handle.hello.batch_nbytes,
    ) == (0.0, 0, 0, None, 0)
    assert (
        handle.hello.weights_structure,
        handle.hello.env_seed,
        handle.memory.ring,
        handle.memory.pipe_path,
        handle.memory.pipe,
    ) == (None,) * 5
    assert (
        handle.lockstep.requests,
        handle.lockstep.inbox,
        handle.commands.changes_sent,
        handle.commands.resets_sent,
    ) == ((), (), 0, 0)
    assert (
        handle.heartbeats.last_beat,
        handle.heartbeats.last_steps,
        handle.heartbeats.last_progress,
        handle.heartbeats.busy,
        handle.heartbeats.partial,
    ) == (0.0, -1, 0.0, False, False)
    assert (
        handle.batches.sent,
        handle.batches.next_seq,
        handle.batches.missing_since,
        handle.unreachable_since,
    ) == (0, 0, None, None)
    assert (handle.batches.traj_counter, handle.batches.frames) == (0, 0)
    assert handle.on_beat({"steps": 0, "busy": False, "discarded": 1}, now=0.0) == 1
    assert handle.heartbeats.on_env_restarts(1) == 1


def test_a_credit_pipe_opened_at_the_hello_is_the_one_credits_go_down(tmp_path: Any) -> None:
    path = tmp_path / "pipe"
    reader = CreditPipe.create(str(path))  # the worker's end, which the collector's end needs open to write
    handle = ready()
    handle.memory.make_credit_pipe(str(path))
    writer = CreditPipeWriter.open(str(path))
    try:
        handle.memory.use_credit_pipe(writer)
        assert handle.memory.pipe is writer
        assert handle.memory.pipe.credit(3)
        assert reader.read() == [(CREDIT, 3)]
    finally:
        writer.close()
        reader.close()


def test_an_incarnation_over_removes_the_credit_pipe_it_left(tmp_path: Any) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    handle = ready()
    handle.memory.make_credit_pipe(str(pipe))
    handle.on_death(lockstep=False, running=False)
    assert not pipe.exists()


async def test_a_hand_started_worker_gets_the_collectors_heartbeats_and_its_slot_is_freed_when_it_goes_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = Pool(0, max_restarts=1, heartbeat_timeout=0.3)
    remote = WorkerHandle(0, config(0, remote=True, heartbeat_interval=0.05))
    remote.on_vacate(now=time.monotonic())
    remote.on_join(now=time.monotonic())
    remote.on_hello(hello())
    remote.on_greeted(now=time.monotonic())
    pool.handles.append(remote)
    alive = True

    async def beating() -> None:  # what the pool's receive loop does with its messages
        while alive:
            remote.heartbeats.on_message(now=time.monotonic())
            await anyio.sleep(0.02)

    async with monitoring(pool) as monitor, anyio.create_task_group() as tg:
        tg.start_soon(beating)
        with WorkerSocket(monitor.endpoint.address, remote.identity) as worker:
            for _ in range(2):  # beats keep coming, at its interval
                frames = await anyio.to_thread.run_sync(worker.recv, DEADLINE)
                assert frames is not None
                header, _ = unpack_message([bytes(f) for f in frames], kinds=P.TO_WORKER)
                assert header["kind"] == P.HEARTBEAT
        assert (pool.spawned, pool.vacated, pool.events.failure) == ([], [], None)
        alive = False  # silent from now on
        await until(pool, lambda: pool.vacated)
    assert (pool.vacated, pool.spawned, remote.restarts) == ([0], [], 1)
    assert any("waiting for a worker to join in its place (1/1)" in r.getMessage() for r in caplog.records)


class OtherHosts(Launcher):
    """A launcher whose workers may run on other hosts (as Ray's, submitit's): it is never asked to start one here."""

    name = "other-hosts"
    same_host = False

    def start(self, config: P.WorkerConfig) -> Any:
        raise AssertionError("the liveness loop never starts a worker itself: the pool's spawn does")


async def test_a_killed_worker_is_restarted_once_its_exit_shows() -> None:
    pool = Pool(1, max_restarts=1, heartbeat_timeout=0.3, heavy=True)  # silent: the loop kills it, then restarts it
    async with monitoring(pool):
        await until(pool, lambda: pool.spawned)
    assert pool.exited_before_spawn == [-9]  # waited for: the successor never overlaps a live predecessor
    assert pool.events.failure is None


async def test_workers_launching_closing_or_lost_are_left_alone() -> None:
    pool = Pool(4, max_restarts=1, startup_timeout=0.3, heartbeat_timeout=0.3)
    launching, closing, lost = pool.handles[1:]
    launching.on_launch(now=time.monotonic() - 3600)  # its process is not there yet, and the deadline long past
    closing.on_stopping()
    lost.on_lost(lockstep=False, running=True)
    pool.processes[2].kill()
    pool.processes[3].kill()
    beating = pool.handles[0]
    async with monitoring(pool):
        with anyio.fail_after(DEADLINE):
            start = time.monotonic()
            while time.monotonic() < start + 1.0:  # every deadline passed, more than once
                beating.heartbeats.on_message(now=time.monotonic())
                await pool.events.wait(0.05)
        await loops(pool, 2)
    assert (pool.spawned, pool.vacated, pool.lost_calls, pool.events.failure) == ([], [], 0, None)
    assert [h.state for h in pool.handles] == [WorkerState.READY, WorkerState.STARTING, WorkerState.STOPPING,
                                               WorkerState.LOST]  # fmt: skip
    assert (launching.restarts, closing.restarts, lost.restarts, pool.counters.dropped_batches) == (0, 0, 0, 0)


async def test_a_worker_dead_while_the_pool_closes_is_not_restarted() -> None:
    pool = Pool(2, max_restarts=2)
    handle = pool.handles[0]
    assert pool.events.closing()
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.spawned or handle.state is WorkerState.DEAD)
        handle.on_stopping()  # what the pool's close does next
    assert (pool.spawned, handle.restarts, pool.events.failure) == ([], 0, None)


async def test_elastic_a_worker_dead_before_the_pool_runs_fails_its_start() -> None:
    pool = Pool(2, max_restarts=0, on_worker_loss="continue", running=False)
    async with monitoring(pool):
        pool.processes[0].kill()
        await until(pool, lambda: pool.events.failure or pool.lost_calls)
    assert isinstance(pool.events.failure, WorkerCrashedError)
    assert (pool.lost_calls, pool.counters.lost_workers, pool.handles[0].state) == (0, 0, WorkerState.DEAD)


@pytest.mark.parametrize("joined", [False, True])
async def test_a_slot_for_a_hand_started_worker_times_out_naming_what_did_not_happen(joined: bool) -> None:
    pool = Pool(0, max_restarts=0, startup_timeout=0.3)
    remote = WorkerHandle(0, config(0, remote=True))
    remote.on_vacate(now=time.monotonic())
    if joined:  # joined, and never said hello
        remote.on_join(now=time.monotonic())
    pool.handles.append(remote)
    async with monitoring(pool):
        await until(pool, lambda: pool.events.failure)
    failure = pool.events.failure
    assert isinstance(failure, WorkerTimeoutError)
    assert failure.worker_id == 0
    expected = r"worker 0 \(pid None\) did not start" if joined else "no remote worker joined as worker 0"
    assert re.match(rf"^{expected} within startup_timeout=0\.3s$", str(failure)), str(failure)


async def test_a_slot_for_a_hand_started_worker_not_open_yet_is_not_timed_out() -> None:
    # While the pool still launches its local workers, a slot for a hand-started worker may be NEW: it has no
    # start time to time out from (timing it from 0 made it "die" at once: an illegal move from NEW to DEAD).
    pool = Pool(1, max_restarts=0, startup_timeout=0.3)
    remote = WorkerHandle(1, config(1, remote=True))
    pool.handles.append(remote)
    async with monitoring(pool):
        await loops(pool, 3)
        assert pool.events.failure is None
        assert remote.state is WorkerState.NEW
        remote.on_vacate(now=time.monotonic())  # open now: its startup_timeout runs from here
        await until(pool, lambda: pool.events.failure)
    assert re.match(r"^no remote worker joined as worker 1 within startup_timeout=0\.3s$", str(pool.events.failure))


@pytest.mark.parametrize(("heartbeat_timeout", "grace"), [(60.0, 60.0), (0.5, 1.0)])
async def test_a_worker_on_another_host_gets_its_heartbeat_timeout_to_show_its_exit(
    heartbeat_timeout: float, grace: float
) -> None:
    pool = Pool(1, max_restarts=0, heartbeat_timeout=heartbeat_timeout, launcher=OtherHosts())
    handle = pool.handles[0]
    async with monitoring(pool) as monitor:
        assert monitor.unreachable_grace == grace
        handle.on_unreachable(now=time.monotonic() - 1.5)  # past a local worker's grace, within a remote one's
        for _ in range(3):
            handle.heartbeats.on_message(now=time.monotonic())
            await loops(pool, 1)
        if grace > 1.5:
            assert (handle.state, pool.events.failure) == (WorkerState.UNREACHABLE, None)
        else:
            assert isinstance(pool.events.failure, WorkerCrashedError)
            assert "cannot be reached" in str(pool.events.failure)


async def test_an_idle_worker_that_beats_is_not_hung_however_long_it_makes_no_step() -> None:
    pool = Pool(1, max_restarts=0, heartbeat_timeout=0.3)
    handle = pool.handles[0]
    handle.on_beat({"steps": 3, "busy": False}, now=time.monotonic())
    async with monitoring(pool):
        with anyio.fail_after(DEADLINE):
            start = time.monotonic()
            while time.monotonic() < start + 1.0:  # heartbeat_timeout passed three times over
                handle.heartbeats.on_message(now=time.monotonic())
                handle.on_beat({"steps": 3, "busy": False}, now=time.monotonic())
                await pool.events.wait(0.05)
        handle.heartbeats.on_message(now=time.monotonic())
        await loops(pool, 1)
    assert (pool.events.failure, handle.state) == (None, WorkerState.READY)


def received(worker: WorkerSocket, wait: float) -> list[str]:
    """The kinds of the messages ``worker`` got, waiting up to ``wait`` seconds for the first."""
    kinds = []
    while (frames := worker.recv(wait)) is not None:
        header, _ = unpack_message([f.bytes for f in frames], kinds=P.TO_WORKER)
        kinds.append(header["kind"])
        wait = 0.0
    return kinds


@pytest.mark.parametrize("same_host", [True, False])
async def test_the_collectors_heartbeats_go_to_ready_workers_with_no_parent_here(same_host: bool) -> None:
    pool = Pool(1, max_restarts=0, heartbeat_interval=0.05, launcher=None if same_host else OtherHosts())
    joined = WorkerHandle(1, config(1, remote=True, heartbeat_interval=0.05))  # joined, no hello yet
    joined.on_vacate(now=time.monotonic())
    joined.on_join(now=time.monotonic())
    closing = WorkerHandle(2, config(2, remote=True, heartbeat_interval=0.05))
    closing.on_vacate(now=time.monotonic())
    closing.on_join(now=time.monotonic())
    closing.on_hello(hello())
    closing.on_greeted(now=time.monotonic())
    closing.on_stopping()
    remote = WorkerHandle(3, config(3, remote=True, heartbeat_interval=0.05))
    remote.on_vacate(now=time.monotonic())
    remote.on_join(now=time.monotonic())
    remote.on_hello(hello())
    remote.on_greeted(now=time.monotonic())
    pool.handles += [joined, closing, remote]
    names = ["local", "joined", "closing", "remote"]  # local: a process started here, which watches its parent
    async with monitoring(pool) as monitor, AsyncExitStack() as stack:
        sockets = {name: stack.enter_context(WorkerSocket(monitor.endpoint.address, handle.identity))
                   for name, handle in zip(names, pool.handles, strict=True)}  # fmt: skip
        for _ in range(3):  # each socket connected by now: the next beats reach whoever they are sent to
            await anyio.to_thread.run_sync(sockets["remote"].recv, DEADLINE)
        for handle in pool.handles:
            handle.heartbeats.on_message(now=time.monotonic())
        beats = {name: await anyio.to_thread.run_sync(received, sockets[name], 0.5) for name in names}
    assert beats["remote"]
    assert set(beats["remote"]) == {P.HEARTBEAT}
    assert (beats["joined"], beats["closing"]) == ([], [])
    assert bool(beats["local"]) is not same_host


async def test_with_no_worker_yet_the_loop_goes_round() -> None:
    pool = Pool(0, max_restarts=0)
    async with monitoring(pool) as monitor:
        await loops(pool, 3)
        assert not monitor.stopped.is_set()
    assert pool.events.failure is None


async def test_the_collectors_heartbeat_goes_once_per_interval() -> None:
    pool = Pool(0, max_restarts=0)
    remote = WorkerHandle(0, config(0, remote=True, heartbeat_interval=3600.0))  # the next one in an hour
    remote.on_vacate(now=time.monotonic())
    remote.on_join(now=time.monotonic())
    remote.on_hello(hello())
    remote.on_greeted(now=time.monotonic())
    pool.handles.append(remote)
    async with monitoring(pool) as monitor:
        with WorkerSocket(monitor.endpoint.address, remote.identity) as worker:
            await loops(pool, 1)  # the first beat went, before or after the socket connected: one at most
            remote.heartbeats.on_message(now=time.monotonic())
            await loops(pool, 3)
            beats = await anyio.to_thread.run_sync(received, worker, 0.5)
    assert beats in ([], [P.HEARTBEAT])


async def test_a_batch_announced_a_moment_ago_is_waited_for() -> None:
    pool = Pool(1, max_restarts=0)  # heartbeat_timeout: a minute
    handle = pool.handles[0]
    async with monitoring(pool):
        handle.on_beat({"steps": 3, "busy": False, "sent": 1}, now=time.monotonic())
        await loops(pool, 3)
        assert (pool.events.failure, handle.batches.missing_since is not None) == (None, True)
        handle.on_batch(batch(0), DATA, lockstep=False)
        await loops(pool, 1)
    assert (pool.events.failure, handle.state) == (None, WorkerState.READY)
