"""ZeroMQ endpoints with real sockets: a spawned worker process, ipc and tcp loopback, timeouts, cancellation.

The endpoint's tests run under asyncio and trio: plain test functions that call
``anyio.run(..., backend=backend)``, because pytest-asyncio's auto mode claims ``async def``
tests for asyncio alone, and anyio's pytest plugin would then fight it over the same functions.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from acollect._runtime.endpoint import Endpoint, WorkerSocket
from acollect._runtime.wire import pack_message, unpack_message
from acollect.errors import ConfigurationError, TransportError

DEADLINE = 60.0


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(backend: str, main: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(main, backend=backend)


def worker_batch(worker: int) -> TensorDict:
    generator = torch.Generator().manual_seed(worker)
    return TensorDict(
        {
            "observation": torch.randn(4, 16, 3, generator=generator),
            "action": torch.randint(0, 2, (4, 16), generator=generator),
            ("next", "pixels"): torch.randint(0, 256, (4, 16, 4, 84, 84), dtype=torch.uint8, generator=generator),
            ("next", "done"): torch.zeros(4, 16, 1, dtype=torch.bool),
        },
        batch_size=[4, 16],
        names=[None, "time"],
    )


def worker_main(addresses: list[str], worker: int) -> None:
    """A worker process: sends one batch to each endpoint and waits for its ack."""
    for address in addresses:
        with WorkerSocket(address, f"worker-{worker}".encode()) as sock:
            sock.send(pack_message("batch", {"worker": worker}, worker_batch(worker)), timeout=DEADLINE)
            reply = sock.recv(timeout=DEADLINE)
            if reply is None:
                raise SystemExit(2)
            header, _ = unpack_message(reply, kinds={"ack"})
            if header["worker"] != worker:
                raise SystemExit(3)


def test_spawned_worker_sends_batches_over_ipc_and_tcp(backend: str) -> None:
    async def main() -> None:
        async with Endpoint() as ipc, Endpoint("tcp://127.0.0.1:0") as tcp:
            assert ipc.address.startswith("ipc://")
            assert tcp.address.startswith("tcp://127.0.0.1:")
            assert not tcp.address.endswith((":0", ":*"))
            addresses = [ipc.address, tcp.address]
            process = multiprocessing.get_context("spawn").Process(target=worker_main, args=(addresses, 1))
            process.start()
            try:
                for endpoint in (ipc, tcp):
                    identity, frames = await endpoint.recv(timeout=DEADLINE)
                    header, td = unpack_message(frames, kinds={"batch"})
                    assert identity == b"worker-1"
                    assert header["worker"] == 1
                    assert td is not None
                    assert (td == worker_batch(1)).all()
                    assert td.names == [None, "time"]
                    await endpoint.send(identity, pack_message("ack", {"worker": 1}))
                await anyio.to_thread.run_sync(process.join, DEADLINE)
                assert process.exitcode == 0
            finally:
                if process.is_alive():
                    process.kill()
                    process.join(DEADLINE)

    run(backend, main)


def test_round_trip_in_both_directions(backend: str) -> None:
    async def main() -> None:
        async with Endpoint() as endpoint:
            with WorkerSocket(endpoint.address, b"w0") as worker:
                worker.send([b"hello", b"x" * 200_000], timeout=DEADLINE)
                identity, frames = await endpoint.recv(timeout=DEADLINE)
                assert (identity, [bytes(f) for f in frames]) == (b"w0", [b"hello", b"x" * 200_000])
                weights = torch.arange(1000, dtype=torch.float32)
                await endpoint.send(b"w0", [b"weights", weights.numpy()])
                reply = worker.recv(timeout=DEADLINE)
                assert reply is not None
                assert torch.equal(torch.frombuffer(bytearray(reply[1]), dtype=torch.float32), weights)

    run(backend, main)


def test_recv_times_out(backend: str) -> None:
    async def main() -> None:
        async with Endpoint() as endpoint:
            with pytest.raises(TimeoutError, match="no message arrived"):
                await endpoint.recv(timeout=0.05)
            with pytest.raises(TimeoutError):
                await endpoint.recv(timeout=0)

    run(backend, main)


def test_cancelled_recv_leaves_the_endpoint_usable(backend: str) -> None:
    async def main() -> None:
        async with Endpoint() as endpoint:
            with anyio.move_on_after(0.05) as scope:
                await endpoint.recv(timeout=DEADLINE)
            assert scope.cancelled_caught
            with WorkerSocket(endpoint.address, b"w0") as worker:
                worker.send([b"after the cancel"], timeout=DEADLINE)
                identity, frames = await endpoint.recv(timeout=DEADLINE)
            assert (identity, bytes(frames[0])) == (b"w0", b"after the cancel")

    run(backend, main)


async def test_cancellation_passes_through_untouched() -> None:
    async with Endpoint() as endpoint:
        task = asyncio.ensure_future(endpoint.recv(timeout=DEADLINE))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_close_removes_the_ipc_file_and_is_idempotent(tmp_path: Path) -> None:
    endpoint = Endpoint()
    path = endpoint.address.removeprefix("ipc://")
    assert os.path.exists(path)
    endpoint.close()
    endpoint.close()
    assert not os.path.exists(path)
    assert not os.path.exists(os.path.dirname(path))  # the private temp dir too
    own = tmp_path / "collector.sock"
    explicit = Endpoint(f"ipc://{own}")
    assert explicit.address == f"ipc://{own}"
    assert own.exists()
    explicit.close()
    assert not own.exists()


def test_a_closed_endpoint_refuses_work(backend: str) -> None:
    async def main() -> None:
        endpoint = Endpoint()
        endpoint.close()
        with pytest.raises(TransportError, match="closed"):
            await endpoint.recv(timeout=1)
        with pytest.raises(TransportError, match="closed"):
            await endpoint.send(b"w0", [b"x"])

    run(backend, main)


def test_send_to_unknown_worker_is_a_transport_error(backend: str) -> None:
    async def main() -> None:
        async with Endpoint() as endpoint:
            with pytest.raises(TransportError, match="no worker with identity b'ghost'"):
                await endpoint.send(b"ghost", [b"hello"])

    run(backend, main)


def test_binding_a_taken_address_is_a_transport_error(backend: str) -> None:
    async def main() -> None:
        async with Endpoint("tcp://127.0.0.1:0") as first:
            with pytest.raises(TransportError, match="cannot bind"):
                Endpoint(first.address)

    run(backend, main)


def test_worker_send_times_out_without_a_collector(tmp_path: Path) -> None:
    with WorkerSocket(f"ipc://{tmp_path}/nobody.sock", b"w0") as worker:
        with pytest.raises(TimeoutError, match="did not take a message"):
            worker.send([b"hello"], timeout=0.05)
        assert worker.recv(timeout=0.01) is None
    with pytest.raises(TransportError, match="closed"):
        worker.recv(timeout=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"address": "udp://127.0.0.1:5"}, "address='udp"),
        ({"address": "ipc:///" + "x" * 200}, "at most 107 bytes"),
        ({"hwm": 0}, "hwm=0"),
        ({"heartbeat_ivl": -1}, "heartbeat_ivl=-1"),
        ({"max_message_bytes": 0}, "max_message_bytes=0"),
    ],
)
def test_endpoint_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Endpoint(**kwargs).close()


@pytest.mark.parametrize("identity", [b"", b"\x00lead", "text", b"x" * 256])
def test_worker_rejects_bad_identities(identity: object) -> None:
    with pytest.raises(ConfigurationError, match="identity="):
        WorkerSocket("tcp://127.0.0.1:5555", identity)  # type: ignore[arg-type]


def test_timeouts_must_be_finite_and_non_negative(backend: str) -> None:
    async def main() -> None:
        async with Endpoint() as endpoint:
            for bad in (-1, float("nan"), float("inf"), "1"):
                with pytest.raises(ConfigurationError, match="timeout="):
                    await endpoint.recv(timeout=bad)  # type: ignore[arg-type]

    run(backend, main)


def test_cancellation_passes_through_untouched_under_anyio(backend: str) -> None:
    async def main() -> None:
        caught: list[BaseException] = []
        async with Endpoint() as endpoint:

            async def receive() -> None:
                try:
                    await endpoint.recv(timeout=DEADLINE)
                except BaseException as exc:
                    caught.append(exc)
                    raise

            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert len(caught) == 1
        assert isinstance(caught[0], anyio.get_cancelled_exc_class())

    run(backend, main)


def sender_thread(address: str, count: int, *, identity: bytes = b"w0", pause_every: int = 0) -> threading.Thread:
    """A worker thread sending ``count`` numbered messages as fast as it can (pausing now and then)."""

    def send_all() -> None:
        with WorkerSocket(address, identity, hwm=1000) as worker:
            for i in range(count):
                worker.send([i.to_bytes(4, "little")], timeout=DEADLINE, copy=True)
                if pause_every and i % pause_every == 0:
                    time.sleep(0.001)
            assert worker.recv(timeout=DEADLINE) is not None  # keep the connection until all arrived

    thread = threading.Thread(target=send_all, daemon=True)
    thread.start()
    return thread


def test_a_burst_of_messages_all_arrive_in_order(backend: str) -> None:
    """ZeroMQ's descriptor is edge-triggered: a missed edge would stall the loop (or lose the tail)."""

    async def main() -> None:
        async with Endpoint(hwm=1000) as endpoint:
            thread = sender_thread(endpoint.address, 10_000)
            start = time.monotonic()
            received = []
            for _ in range(10_000):
                _, frames = await endpoint.recv(timeout=DEADLINE)
                received.append(int.from_bytes(bytes(frames[0]), "little"))
            elapsed = time.monotonic() - start
            await endpoint.send(b"w0", [b"done"])
            await anyio.to_thread.run_sync(thread.join, DEADLINE)
        assert received == list(range(10_000))
        # Each missed edge would cost a whole poll interval (50 ms); 10,000 messages take well under 10 s.
        assert elapsed < 20

    run(backend, main)


def test_messages_sent_while_the_loop_is_busy_elsewhere_arrive(backend: str) -> None:
    async def main() -> None:
        async with Endpoint(hwm=1000) as endpoint:
            with WorkerSocket(endpoint.address, b"w0", hwm=1000) as worker:
                # Some arrive while a recv waits and gets cancelled, more while the loop does other things.
                with anyio.move_on_after(0.02):
                    await endpoint.recv(timeout=DEADLINE)
                for i in range(300):
                    worker.send([i.to_bytes(4, "little")], timeout=DEADLINE, copy=True)
                time.sleep(0.05)  # noqa: ASYNC251 (on purpose: the loop is blocked while messages arrive)
                await anyio.sleep(0.05)
                received = []
                for _ in range(300):
                    _, frames = await endpoint.recv(timeout=1)
                    received.append(int.from_bytes(bytes(frames[0]), "little"))
                assert received == list(range(300))
                with pytest.raises(TimeoutError):
                    await endpoint.recv(timeout=0.05)

    run(backend, main)


def test_cancelled_recvs_lose_no_message(backend: str) -> None:
    """Receives cancelled at every moment (as a message arrives, too) never take one away."""

    async def main() -> None:
        count = 2_000
        async with Endpoint(hwm=1000) as endpoint:
            thread = sender_thread(endpoint.address, count, pause_every=50)
            received: list[int] = []
            cancelled = 0
            deadline = time.monotonic() + DEADLINE
            while len(received) < count and time.monotonic() < deadline:
                with anyio.move_on_after(0.0002 * (len(received) % 7)) as scope:
                    _, frames = await endpoint.recv(timeout=DEADLINE)
                    received.append(int.from_bytes(bytes(frames[0]), "little"))
                cancelled += scope.cancelled_caught
            await endpoint.send(b"w0", [b"done"])
            await anyio.to_thread.run_sync(thread.join, DEADLINE)
        assert received == list(range(count))
        assert cancelled > 0

    run(backend, main)


def test_concurrent_senders_and_a_receiver_through_small_queues(backend: str) -> None:
    """Tasks waiting on one socket at once (sends blocked by a full queue, a receive) all make progress."""

    def echo(address: str, count: int, ready: threading.Event) -> None:
        with WorkerSocket(address, b"echo", hwm=4) as worker:
            worker.send([b"hello"], timeout=DEADLINE)
            ready.set()
            for _ in range(count):
                frames = worker.recv(timeout=DEADLINE)
                assert frames is not None
                worker.send(frames, timeout=DEADLINE, copy=True)
            assert worker.recv(timeout=DEADLINE) is not None  # closing drops what is still queued (LINGER 0)

    async def main() -> None:
        per_task, tasks = 500, 4
        async with Endpoint(hwm=4) as endpoint:
            ready = threading.Event()
            thread = threading.Thread(target=echo, args=(endpoint.address, per_task * tasks, ready), daemon=True)
            thread.start()
            assert (await endpoint.recv(timeout=DEADLINE))[0] == b"echo"
            received: list[bytes] = []

            async def send_some(task: int) -> None:
                for i in range(per_task):
                    await endpoint.send(b"echo", [f"{task}:{i}".encode()], timeout=DEADLINE)

            async def receive_all() -> None:
                for _ in range(per_task * tasks):
                    _, frames = await endpoint.recv(timeout=DEADLINE)
                    received.append(bytes(frames[0]))

            start = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive_all)
                for task in range(tasks):
                    tg.start_soon(send_some, task)
            elapsed = time.monotonic() - start
            await endpoint.send(b"echo", [b"done"])
            await anyio.to_thread.run_sync(thread.join, DEADLINE)
        assert sorted(received) == sorted(f"{t}:{i}".encode() for t in range(tasks) for i in range(per_task))
        for task in range(tasks):  # each sender's messages in its own order
            mine = [m for m in received if m.startswith(f"{task}:".encode())]
            assert mine == [f"{task}:{i}".encode() for i in range(per_task)]
        assert elapsed < 30

    run(backend, main)


def test_send_to_a_full_queue_times_out_within_its_deadline(backend: str) -> None:
    async def main() -> None:
        async with Endpoint(hwm=1) as endpoint:
            with WorkerSocket(endpoint.address, b"w0", hwm=1) as worker:
                worker.send([b"hello"], timeout=DEADLINE)
                await endpoint.recv(timeout=DEADLINE)
                big = b"x" * 1_000_000  # fills the kernel's buffers too, in a few messages

                async def fill() -> tuple[float, str]:
                    # ZeroMQ keeps moving queued messages into the kernel's buffers until those are full too.
                    for _ in range(100):
                        start = time.monotonic()
                        try:
                            await endpoint.send(b"w0", [big], timeout=0.2)
                        except TimeoutError as exc:
                            return time.monotonic() - start, str(exc)
                    return 0.0, "100 MB went into a queue of one message that nobody reads"

                elapsed, error = await fill()
                assert error == "could not queue a message for worker b'w0' within 0.2s"
                assert elapsed >= 0.19  # never before its deadline; how soon after is measured by benchmarks/cancel.py

                # A worker that reads again lets a waiting send through: one whose deadline is an hour away, so only
                # the worker's reads can end it (the test's deadline catches a send that waits on).
                def drain() -> None:
                    while worker.recv(timeout=0.5) is not None:
                        pass

                drained = threading.Thread(target=drain)
                with anyio.fail_after(DEADLINE):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(functools.partial(endpoint.send, b"w0", [b"last"], timeout=3600.0))
                        await anyio.sleep(0.1)
                        drained.start()
                await anyio.to_thread.run_sync(drained.join, DEADLINE)

    run(backend, main)


def test_closing_wakes_a_waiting_recv(backend: str) -> None:
    async def main() -> None:
        endpoint = Endpoint()
        errors: list[BaseException] = []

        async def receive() -> None:
            try:
                await endpoint.recv(timeout=DEADLINE)
            except TransportError as exc:
                errors.append(exc)

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.sleep(0.02)
            endpoint.close()
        assert time.monotonic() - start < DEADLINE / 2  # woken by the close, not by the receive's own deadline
        assert len(errors) == 1
        assert "closed" in str(errors[0])

    run(backend, main)


def test_an_endpoint_dropped_unclosed_in_a_reference_cycle_is_closed_by_the_garbage_collector() -> None:
    # pyzmq's own finalizers would term the context before closing the socket, and wait for it forever.
    endpoint = Endpoint()
    path = endpoint.address.removeprefix("ipc://")
    assert os.path.exists(path)
    cycle: list[object] = [endpoint]
    cycle.append(cycle)
    del endpoint, cycle
    collecting = threading.Thread(target=gc.collect, name="gc")
    collecting.start()
    collecting.join(10)
    assert not collecting.is_alive(), "closing the endpoint's context blocked"
    assert not os.path.exists(path), "the socket file of a collected endpoint is removed with it"
