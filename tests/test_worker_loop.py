"""The worker main loop driven for real over ZeroMQ, with no collector in between.

The test plays the collector: it binds a real :class:`~acollect._runtime.endpoint.Endpoint`, runs
:func:`~acollect._workers.main.run_worker` (in a thread, and once in a spawned process the way
:mod:`acollect._workers.process` starts it), and exchanges wire messages with it. The worker's control
socket has identity ``w<index>.<gen>``; its runner sends batches from a second socket, ``w<index>.<gen>d``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._batches.slot_ring import CreditPipeWriter, credit_pipe_path
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.endpoint import Endpoint
from acollect._runtime.wire import PROTOCOL_VERSION, pack_message, unpack_message, validate_layout
from acollect._weights.sync import flatten_params
from acollect._workers import protocol as P
from acollect._workers.main import run_worker
from acollect._workers.process import WorkerProcess, start_worker
from acollect.errors import ProtocolError
from acollect.testing import CountingEnv, SlowEnv, WeightProbe, assert_counting_batch, no_leaks

CONTROL, DATA = P.worker_identity(0, 0), P.worker_identity(0, 0) + b"d"
WAIT = 10.0  # bounds a hang; no test comes close


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """No worker process, runner thread or shared-memory segment outlives a test."""
    with no_leaks():
        yield


def config_for(address: str, **overrides: Any) -> P.WorkerConfig:
    rollout: dict[str, Any] = {
        "create_env_fn": functools.partial(CountingEnv, num_envs=2, episode_length=5),
        "policy": WeightProbe(0.0),
        "frames_per_batch": 8,
    }
    fields: dict[str, Any] = {
        "index": 0,
        "generation": 0,
        "n_workers": 1,
        "address": address,
        "parent_pid": 0,  # no parent to watch: the worker runs in this process
        "heartbeat_interval": 0.05,
        "filter_warnings": False,  # a thread must not change this process's warning filters
        "num_threads": torch.get_num_threads(),
    }
    spec_fields = {f.name for f in dataclasses.fields(RolloutSpec)}
    for name, value in overrides.items():
        (rollout if name in spec_fields else fields)[name] = value
    return P.WorkerConfig(**fields, rollout=RolloutSpec(**rollout))


class Collector:
    """The collector's side of the protocol: one endpoint, one worker."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.heartbeats: list[dict[str, Any]] = []

    async def send(self, kind: str, fields: dict[str, Any] | None = None, td: TensorDictBase | None = None) -> None:
        await self.endpoint.send(CONTROL, pack_message(kind, fields, td))

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.endpoint.send(CONTROL, frames)

    async def recv(self, *kinds: str, timeout: float = WAIT) -> tuple[bytes, dict[str, Any], TensorDict | None]:
        """The next message of one of ``kinds`` (heartbeats are kept in :attr:`heartbeats` meanwhile)."""
        with anyio.fail_after(timeout):
            while True:
                identity, frames = await self.endpoint.recv(timeout=timeout)
                header, td = unpack_message(frames, kinds=P.TO_COLLECTOR, copy=True)
                if header["kind"] == P.HEARTBEAT:
                    self.heartbeats.append(header)
                if header["kind"] in kinds:
                    return identity, header, td

    async def nothing_but_heartbeats(self, seconds: float) -> None:
        """Asserts that only heartbeats arrive for ``seconds``."""
        with anyio.move_on_after(seconds):
            _, header, _ = await self.recv(*(P.TO_COLLECTOR - {P.HEARTBEAT}), timeout=seconds + 1)
            raise AssertionError(f"unexpected {header['kind']!r} message: {header}")


class WorkerThread:
    """``run_worker(config)`` in a thread of this process; :attr:`result` or :attr:`error` once it returned."""

    def __init__(self, config: P.WorkerConfig) -> None:
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(config,), name="acollect-test-worker", daemon=True)
        self.thread.start()

    def _main(self, config: P.WorkerConfig) -> None:
        try:
            self.result = run_worker(config)
        except BaseException as exc:
            self.error = exc

    async def join(self, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while self.thread.is_alive():
            assert time.monotonic() < deadline, "the worker loop did not exit"
            await anyio.sleep(0.01)


def wait_for_exit(process: WorkerProcess, timeout: float) -> int | None:
    """Waits (blocking) up to ``timeout`` seconds for ``process`` to exit; returns its exit code."""
    deadline = time.monotonic() + timeout
    while process.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    return process.exitcode


@asynccontextmanager
async def worker(**overrides: Any) -> AsyncIterator[tuple[Collector, WorkerThread, dict[str, Any]]]:
    """A worker loop connected to a fresh endpoint; yields after its ``hello``, stops it on exit."""
    async with Endpoint() as endpoint:
        config = config_for(endpoint.address, **overrides)
        thread = WorkerThread(config)
        collector = Collector(endpoint)
        try:
            _, hello, _ = await collector.recv(P.HELLO)
            yield collector, thread, hello
        finally:
            if thread.thread.is_alive():
                with anyio.CancelScope(shield=True):
                    await collector.send(P.STOP)
                    await thread.join()


def weights_message(
    version: int, policy: torch.nn.Module, model_id: str = "policy"
) -> tuple[dict[str, Any], TensorDict]:
    """A ``weights`` message as the collector's pool builds it (one model, weights as a tensor frame)."""
    layout, flat = flatten_params(TensorDict.from_module(policy))
    return {"version": version, "models": [{"id": model_id, "layout": layout}]}, TensorDict(m0=flat, batch_size=[])


# -- hello, batches, heartbeats -----------------------------------------------------------------------


async def test_hello_says_who_the_worker_is_and_what_it_sends() -> None:
    async with worker() as (_, _, hello):
        assert hello["kind"] == P.HELLO
        assert (hello["worker"], hello["gen"]) == (0, 0)
        assert hello["pid"] == os.getpid()
        assert hello["protocol"] == PROTOCOL_VERSION
        assert hello["n_envs"] == 2
        layout = validate_layout(hello["layout"])
        assert layout.batch_size == (2, 4)  # its 8 frames: the collector's plan knows them from n_envs
        keys = {leaf.key for leaf in layout.leaves}
        assert {("observation",), ("action",), ("next", "reward"), ("collector", "traj_ids")} <= keys


async def test_one_batch_per_collect_request_and_no_more() -> None:
    async with worker() as (collector, _, _):
        for _ in range(3):
            await collector.send(P.COLLECT)
        batches = []
        for seq in range(3):
            identity, header, td = await collector.recv(P.BATCH)
            assert identity == DATA  # batches come from the runner's own socket
            assert (header["seq"], header["worker"], header["gen"]) == (seq, 0, 0)
            assert (header["policy_version"], header["frames"], header["slot"]) == (0, 8 * (seq + 1), None)
            assert td is not None
            assert td.batch_size == (2, 4)
            batches.append(td)
        assert_counting_batch(torch.cat(batches, dim=1))  # consecutive batches continue each other
        await collector.nothing_but_heartbeats(0.3)
        beat = collector.heartbeats[-1]
        assert (beat["sent"], beat["steps"], beat["busy"]) == (3, 12, False)


async def test_heartbeats_come_at_the_configured_interval_and_show_progress() -> None:
    async with worker(heartbeat_interval=0.05) as (collector, _, _):
        started = time.monotonic()
        for _ in range(4):
            await collector.recv(P.HEARTBEAT)
        assert time.monotonic() - started < 2.0
        assert collector.heartbeats[-1]["steps"] == 0
        await collector.send(P.COLLECT)
        await collector.recv(P.BATCH)
        _, beat, _ = await collector.recv(P.HEARTBEAT)
        assert (beat["steps"], beat["sent"]) == (4, 1)


async def test_run_collects_while_credits_last() -> None:
    async with worker() as (collector, _, _):
        await collector.send(P.RUN, {"credits": 2})
        seqs = [(await collector.recv(P.BATCH))[1]["seq"] for _ in range(2)]
        assert seqs == [0, 1]
        await collector.nothing_but_heartbeats(0.3)  # no credit left: the runner waits
        await collector.send(P.CREDIT, {"slot": None})
        _, header, _ = await collector.recv(P.BATCH)
        assert header["seq"] == 2


async def test_credits_down_the_credit_pipe_run_the_runner_as_credit_messages_do() -> None:
    path = credit_pipe_path()
    async with worker(pipe=path) as (collector, _, hello):
        assert hello["pipe"] == path
        assert stat.S_ISFIFO(os.stat(path).st_mode)
        writer = CreditPipeWriter.open(path)
        try:
            await collector.send(P.RUN, {"credits": 1})
            assert (await collector.recv(P.BATCH))[1]["seq"] == 0
            await collector.nothing_but_heartbeats(0.3)  # no credit left: the runner waits on its pipe
            assert writer.credit()
            assert (await collector.recv(P.BATCH))[1]["seq"] == 1
            await collector.send(P.CREDIT, {"slot": None})  # the other path, for the same word
            assert (await collector.recv(P.BATCH))[1]["seq"] == 2
            assert writer.credit()
            assert writer.credit()
            seqs = [(await collector.recv(P.BATCH))[1]["seq"] for _ in range(2)]
            assert seqs == [3, 4]
            await collector.nothing_but_heartbeats(0.3)
            # A pause wakes it too: the credit that comes meanwhile waits for the resume.
            await collector.send(P.PAUSE)
            await collector.send(P.STATE, {"req": 1})
            await collector.recv(P.REPLY)  # its control thread took the pause (it answers in order)
            assert writer.credit()
            await collector.nothing_but_heartbeats(0.3)
            await collector.send(P.RESUME)
            assert (await collector.recv(P.BATCH))[1]["seq"] == 5
        finally:
            writer.close()


async def test_a_credit_pipe_is_removed_with_its_worker_if_never_opened() -> None:
    path = credit_pipe_path()
    async with worker(pipe=path) as (_, _, hello):
        assert hello["pipe"] == path
        assert os.access(path, os.F_OK)
    assert not os.access(path, os.F_OK)
    async with worker() as (collector, _, hello):  # none named: an anonymous pipe, and credits as messages
        assert hello["pipe"] is None
        await collector.send(P.RUN, {"credits": 1})
        await collector.recv(P.BATCH)
        await collector.send(P.CREDIT, {"slot": None})
        assert (await collector.recv(P.BATCH))[1]["seq"] == 1


async def test_pause_holds_the_runner_until_resume() -> None:
    async with worker() as (collector, _, _):
        await collector.send(P.PAUSE)
        await collector.send(P.COLLECT)
        await collector.nothing_but_heartbeats(0.3)
        await collector.send(P.RESUME)
        _, header, td = await collector.recv(P.BATCH)
        assert header["seq"] == 0
        assert td is not None


# -- weights, state --------------------------------------------------------------------------------


async def test_weights_are_acknowledged_and_collect_the_next_batch() -> None:
    async with worker() as (collector, _, _):
        await collector.send(P.COLLECT)
        _, header, td = await collector.recv(P.BATCH)
        assert td is not None
        assert header["policy_version"] == 0
        assert bool((td["action"] == 0).all())
        await collector.send(P.WEIGHTS, *weights_message(1, WeightProbe(1.0)))
        _, ack, _ = await collector.recv(P.ACK)
        assert (ack["version"], ack["worker"]) == (1, 0)
        await collector.send(P.COLLECT)
        _, header, td = await collector.recv(P.BATCH)
        assert td is not None
        assert header["policy_version"] == 1
        assert bool((td["collector", "policy_version"] == 1).all())
        assert bool((td["action"] == 1).all())  # WeightProbe acts with its weight


async def test_weights_pushed_mid_batch_land_at_the_next_batch_asked_for_after_them() -> None:
    env = functools.partial(SlowEnv, 0.01, num_envs=2)
    async with worker(create_env_fn=env, frames_per_batch=40) as (collector, _, _):  # 20 steps: ~0.2 s a batch
        await collector.send(P.COLLECT)
        await collector.send(P.COLLECT)  # asked for before the push: made with the weights it was asked under
        await anyio.sleep(0.05)  # the first batch is in progress
        await collector.send(P.WEIGHTS, *weights_message(1, WeightProbe(1.0)))
        await collector.recv(P.ACK)  # staged, acknowledged at once
        await collector.send(P.COLLECT)  # asked for after it
        for expected in (0, 0, 1):
            _, header, td = await collector.recv(P.BATCH)
            assert td is not None
            assert header["policy_version"] == expected
            assert bool((td["action"] == expected).all())  # never a batch of mixed weights


async def test_state_replies_with_the_counters_and_load_state_restores_them() -> None:
    async with worker() as (collector, _, _):
        await collector.send(P.COLLECT)
        await collector.recv(P.BATCH)
        await collector.send(P.STATE, {"req": 7})
        _, reply, _ = await collector.recv(P.REPLY)
        assert reply["req"] == 7
        assert (reply["frames"], reply["steps"], reply["next_traj_counter"]) == (8, 4, 2)
        await collector.send(P.LOAD_STATE, {"next_traj_counter": 100, "frames": 800})
        await collector.send(P.COLLECT)
        _, header, td = await collector.recv(P.BATCH)
        assert td is not None
        assert header["frames"] == 808
        assert td["collector", "traj_ids"][:, 0].tolist() == [100, 101]  # fresh trajectories from the restored counter


# -- errors ------------------------------------------------------------------------------------------


async def test_weights_for_no_model_are_refused_and_the_worker_keeps_collecting() -> None:
    async with worker() as (collector, thread, _):
        await collector.send(P.WEIGHTS, *weights_message(1, WeightProbe(1.0), model_id="policy.nothing"))
        _, ack, _ = await collector.recv(P.ACK)
        assert ack["version"] == 1
        assert "policy.nothing" in ack["error"]  # refused, named: nothing was applied
        # The worker keeps its weights and goes on: it collects, answers and stops when told.
        await collector.send(P.COLLECT)
        _, header, _ = await collector.recv(P.BATCH)
        assert header["policy_version"] == 0
        await collector.send(P.STATE, {"req": 1})
        await collector.recv(P.REPLY)
        await collector.send(P.STOP)
        await thread.join()
        assert (thread.result, thread.error) == (0, None)


async def test_an_env_that_fails_to_build_is_reported_before_any_hello() -> None:
    def broken_env() -> CountingEnv:
        raise ValueError("no simulator licence")

    async with Endpoint() as endpoint:
        thread = WorkerThread(config_for(endpoint.address, create_env_fn=broken_env))
        collector = Collector(endpoint)
        _, error, _ = await collector.recv(P.ERROR, P.HELLO)
        assert (error["kind"], error["type"], error["message"]) == (P.ERROR, "ValueError", "no simulator licence")
        await collector.recv(P.HEARTBEAT)  # the control loop still runs, for the collector to stop it
        await collector.send(P.STOP)
        await thread.join()
        assert thread.result == 0


async def test_an_env_crash_mid_batch_is_reported_with_its_traceback() -> None:
    from acollect.testing import CrashingEnv

    env = functools.partial(CrashingEnv, 3, num_envs=2)
    async with worker(create_env_fn=env) as (collector, _, _):
        await collector.send(P.COLLECT)
        identity, error, _ = await collector.recv(P.ERROR, P.BATCH)
        assert identity == DATA
        assert (error["kind"], error["type"]) == (P.ERROR, "RuntimeError")
        assert "crashed at step 3" in error["message"]
        assert "step_and_reset_into" in error["traceback"]


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xc1"],  # not msgpack
        pack_message("bogus"),  # not a command
        [pack_message(P.COLLECT)[0].replace(b"\xa1v" + bytes([PROTOCOL_VERSION]), b"\xa1v\x7f")],  # another version
    ],
    ids=["garbage", "unknown-kind", "other-version"],
)
async def test_an_undecodable_command_ends_the_worker_with_a_protocol_error(frames: list[bytes]) -> None:
    # Only the collector that started the worker can reach its control socket: a message that does not
    # parse means the two disagree on the protocol, and the worker ends (the collector sees it exit).
    async with worker() as (collector, thread, _):
        await collector.send_raw(frames)
        await thread.join()
        assert isinstance(thread.error, ProtocolError)


# -- stopping --------------------------------------------------------------------------------------


async def test_stop_ends_the_loop_with_exit_code_zero_and_closes_the_env() -> None:
    envs: list[CountingEnv] = []

    def make_env() -> CountingEnv:
        envs.append(CountingEnv(num_envs=2))
        return envs[-1]

    async with worker(create_env_fn=make_env) as (collector, thread, _):
        await collector.send(P.COLLECT)
        await collector.recv(P.BATCH)
        await collector.send(P.STOP)
        await thread.join()
        assert (thread.result, thread.error) == (0, None)
        assert envs[0].is_closed


async def test_stop_interrupts_a_batch_in_progress() -> None:
    env = functools.partial(SlowEnv, 0.01, num_envs=1)
    async with worker(create_env_fn=env, frames_per_batch=10_000) as (collector, thread, _):  # ~100 s a batch
        await collector.send(P.COLLECT)
        _, beat, _ = await collector.recv(P.HEARTBEAT)
        while not beat["busy"]:
            _, beat, _ = await collector.recv(P.HEARTBEAT)
        started = time.monotonic()
        await collector.send(P.STOP)
        await thread.join()
        assert time.monotonic() - started < 30  # at its next step, not at the end of its batch (~100 s)
        assert thread.result == 0


async def test_a_spawned_worker_process_speaks_the_same_protocol() -> None:
    async with Endpoint() as endpoint:
        config = config_for(endpoint.address, parent_pid=os.getpid(), filter_warnings=True, num_threads=1)
        process = start_worker(config, start_method="spawn")
        try:
            await anyio.to_thread.run_sync(process.write_config)
            collector = Collector(endpoint)
            _, hello, _ = await collector.recv(P.HELLO, timeout=60)  # a fresh interpreter imports torch first
            assert hello["pid"] == process.pid != os.getpid()
            await collector.send(P.COLLECT)
            _, header, td = await collector.recv(P.BATCH)
            assert header["seq"] == 0
            assert td is not None
            assert_counting_batch(td)
            await collector.send(P.STOP)
            assert await anyio.to_thread.run_sync(wait_for_exit, process, WAIT) == 0
        finally:
            process.kill()
            wait_for_exit(process, WAIT)
            process.close()
