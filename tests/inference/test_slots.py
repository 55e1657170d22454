"""Per-step data through shared memory: same-host clients, their slots, late answers, versions, what is left behind."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import anyio
import msgpack
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import InferenceServer
from acollect._batches.shm import SHM_DIR, SHM_PREFIX, shm_available
from acollect.inference.client import VERSION_KEY, RemotePolicy

pytestmark = pytest.mark.skipif(not shm_available(), reason="needs /dev/shm")


class Gated(torch.nn.Module):
    """action = observation + bias, except that an observation of 99 waits for the gate first.

    The gate and the sign that a pass entered it are files, so that the module works in a server process too.
    """

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(()))
        self.gate_file = str(folder / "gate")
        self.entered_file = str(folder / "entered")

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if bool((observation == 99).any()):
            Path(self.entered_file).touch()
            deadline = time.monotonic() + 20
            while not os.path.exists(self.gate_file):
                assert time.monotonic() < deadline, "the gate never opened"
                time.sleep(0.005)
        return observation.clone() + self.bias

    def open_gate(self) -> None:
        Path(self.gate_file).touch()

    def wait_entered(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.entered_file):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True


def served(net: Gated) -> TensorDictModule:
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])  # the very module: its events are ours


def step(value: float, rows: int = 3) -> TensorDict:
    return TensorDict(
        {"observation": torch.full((rows, 1), value), "done": torch.zeros(rows, 1, dtype=torch.bool)}, batch_size=[rows]
    )


def segments() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(f"{SHM_PREFIX}{os.getpid()}-")}


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_same_host_steps_go_through_a_slot_and_answer_each_step_with_its_own_actions_and_version(
    mode: str, tmp_path: Path
) -> None:
    net = Gated(tmp_path)
    before = segments()
    async with InferenceServer(policy_factory=lambda: served(net), address="ipc", max_wait=0, mode=mode) as server:
        assert server.slot_address is not None
        client = RemotePolicy(server.address, b"w0", slots=server.slot_address)
        try:
            answers = []
            for value in (1.0, 2.0, 3.0):
                out = await anyio.to_thread.run_sync(client, step(value))
                answers.append((out["action"].flatten().tolist(), out[VERSION_KEY].tolist()))
            net.bias.data.fill_(10.0)
            assert await server.update_policy_weights_(net) == 1
            out = await anyio.to_thread.run_sync(client, step(4.0))
            answers.append((out["action"].flatten().tolist(), out[VERSION_KEY].tolist()))
            assert segments() == before, "a slot's name is unlinked once both sides mapped it"
            stats = server.stats()
        finally:
            client.close()
    assert answers == [([1.0] * 3, [0] * 3), ([2.0] * 3, [0] * 3), ([3.0] * 3, [0] * 3), ([14.0] * 3, [1] * 3)]
    assert stats.slot_requests == 3, "the first step is a message (it tells the actions' layout), the rest slots"
    assert stats.latency_ms_p50 is not None
    assert segments() == before


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_a_late_answer_to_an_abandoned_step_never_lands_in_the_next_step_of_the_reused_slot(
    mode: str, tmp_path: Path
) -> None:
    net = Gated(tmp_path)
    async with InferenceServer(policy_factory=lambda: served(net), address="ipc", max_wait=0, mode=mode) as server:
        interrupt = threading.Event()
        client = RemotePolicy(server.address, b"w0", slots=server.slot_address, interrupt=interrupt)
        try:
            await anyio.to_thread.run_sync(client, step(1.0))
            await anyio.to_thread.run_sync(client, step(2.0))  # the slot is in use from here on

            def abandoned() -> None:
                with pytest.raises(InterruptedError):
                    client(step(99.0))

            thread = threading.Thread(target=abandoned)
            thread.start()
            assert await anyio.to_thread.run_sync(net.wait_entered, 20)
            interrupt.set()  # a pause: the step gives up while the server still runs its pass
            await anyio.to_thread.run_sync(thread.join, 20)
            interrupt.clear()

            def release_later() -> None:
                time.sleep(0.2)
                net.open_gate()  # the abandoned pass ends now, and its answer arrives first

            threading.Thread(target=release_later).start()
            out = await anyio.to_thread.run_sync(client, step(5.0))
            assert out["action"].flatten().tolist() == [5.0] * 3, "the answer is to this step's observations"
            out = await anyio.to_thread.run_sync(client, step(6.0))
            assert out["action"].flatten().tolist() == [6.0] * 3
            assert server.stats().slot_requests >= 3
        finally:
            net.open_gate()
            client.close()


async def test_a_malformed_hello_is_dropped_and_counted_and_the_server_keeps_answering(tmp_path: Path) -> None:
    net = Gated(tmp_path)
    async with InferenceServer(policy_factory=lambda: served(net), address="ipc", max_wait=0) as server:
        assert server.slot_address is not None
        path = server.slot_address

        def say(hello: bytes) -> bytes:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.settimeout(5)
                sock.connect(path)
                sock.send(hello)
                return sock.recv(16)

        for hello in (b"\xc1garbage", msgpack.packb({"identity": b"x", "name": "/etc/passwd", "layout": {}})):
            assert await anyio.to_thread.run_sync(say, hello) == b"", "a malformed hello's connection is closed"
        client = RemotePolicy(server.address, b"w0", slots=server.slot_address)
        try:
            for value in (1.0, 2.0):
                out = await anyio.to_thread.run_sync(client, step(value))
                assert out["action"].flatten().tolist() == [value] * 3
        finally:
            client.close()
        assert server.stats().dropped_requests == 2
        assert server.stats().slot_requests == 1


async def test_no_slots_without_a_same_host_address_or_when_asked_for_none() -> None:
    module = TensorDictModule(torch.nn.Identity(), in_keys=["observation"], out_keys=["action"])
    for kwargs in ({"address": "tcp://127.0.0.1"}, {"address": "ipc", "slots": False}, {}):
        async with InferenceServer(module, **kwargs) as server:  # type: ignore[arg-type]
            assert server.slot_address is None
    async with InferenceServer(module, address="ipc") as server:
        path = server.slot_address
        assert path is not None
        assert await anyio.Path(path).exists()
    assert not await anyio.Path(path).parent.exists(), "shutdown removes the slot listener's directory"
