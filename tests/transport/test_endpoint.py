"""ZeroMQ endpoints with real sockets: a spawned worker process, ipc and tcp loopback, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from pathlib import Path

import anyio
import pytest
import torch
from tensordict import TensorDict

from acollect.errors import ConfigurationError, TransportError
from acollect.transport.endpoint import Endpoint, WorkerSocket
from acollect.transport.wire import pack_message, unpack_message

DEADLINE = 60.0


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


async def test_spawned_worker_sends_batches_over_ipc_and_tcp() -> None:
    async with Endpoint() as ipc, Endpoint("tcp://127.0.0.1:0") as tcp:
        assert ipc.address.startswith("ipc://")
        assert tcp.address.startswith("tcp://127.0.0.1:")
        assert not tcp.address.endswith((":0", ":*"))
        process = multiprocessing.get_context("spawn").Process(target=worker_main, args=([ipc.address, tcp.address], 1))
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


async def test_round_trip_in_both_directions() -> None:
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


async def test_recv_times_out() -> None:
    async with Endpoint() as endpoint:
        with pytest.raises(TimeoutError, match="no message arrived"):
            await endpoint.recv(timeout=0.05)
        with pytest.raises(TimeoutError):
            await endpoint.recv(timeout=0)


async def test_cancelled_recv_leaves_the_endpoint_usable() -> None:
    async with Endpoint() as endpoint:
        with anyio.move_on_after(0.05) as scope:
            await endpoint.recv(timeout=DEADLINE)
        assert scope.cancelled_caught
        with WorkerSocket(endpoint.address, b"w0") as worker:
            worker.send([b"after the cancel"], timeout=DEADLINE)
            identity, frames = await endpoint.recv(timeout=DEADLINE)
        assert (identity, bytes(frames[0])) == (b"w0", b"after the cancel")


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


async def test_a_closed_endpoint_refuses_work() -> None:
    endpoint = Endpoint()
    endpoint.close()
    with pytest.raises(TransportError, match="closed"):
        await endpoint.recv(timeout=1)
    with pytest.raises(TransportError, match="closed"):
        await endpoint.send(b"w0", [b"x"])


async def test_send_to_unknown_worker_is_a_transport_error() -> None:
    async with Endpoint() as endpoint:
        with pytest.raises(TransportError, match="no worker with identity b'ghost'"):
            await endpoint.send(b"ghost", [b"hello"])


async def test_binding_a_taken_address_is_a_transport_error() -> None:
    async with Endpoint("tcp://127.0.0.1:0") as first:
        with pytest.raises(TransportError, match="cannot bind"):
            Endpoint(first.address)


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


async def test_timeouts_must_be_finite_and_non_negative() -> None:
    async with Endpoint() as endpoint:
        for bad in (-1, float("nan"), float("inf"), "1"):
            with pytest.raises(ConfigurationError, match="timeout="):
                await endpoint.recv(timeout=bad)  # type: ignore[arg-type]
