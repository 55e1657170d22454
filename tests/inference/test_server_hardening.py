"""The inference server on tcp: malformed requests counted and their log bounded, CURVE keys, a hung pass."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import pytest
import torch
import zmq
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import ConfigurationError, InferenceServer
from acollect._runtime.worker_socket import WorkerSocket
from acollect.errors import CollectorStateError, PolicyError
from acollect.inference.client import RemotePolicy
from acollect.testing import wait_until
from acollect.transport.auth import ClientKeys, ServerKeys, create_keys, curve_available

needs_curve = pytest.mark.skipif(not curve_available(), reason="libzmq without CURVE")


def policy() -> TensorDictModule:
    return TensorDictModule(torch.nn.Linear(2, 1), in_keys=["observation"], out_keys=["action"])


def observation() -> TensorDict:
    return TensorDict({"observation": torch.ones(3, 2)}, batch_size=[3])


async def ask(client: RemotePolicy) -> dict[object, torch.Tensor]:
    # RemotePolicy blocks: in a thread, so the event loop keeps serving the server.
    return await anyio.to_thread.run_sync(client, observation())


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    create_keys(tmp_path / "k", workers=["good"])
    create_keys(tmp_path / "other", workers=["stranger"])
    return tmp_path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_malformed_requests_are_counted_logged_once_per_peer_and_the_server_keeps_answering(
    caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    caplog.set_level(logging.WARNING, logger="acollect")
    async with InferenceServer(policy(), address="tcp://127.0.0.1", max_wait=0.001, mode=mode) as server:
        assert server.address is not None
        ctx = zmq.Context()
        peer = ctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(server.address)
        try:
            for i in range(300):  # garbage heads, truncated messages, random bytes
                peer.send_multipart([b"\x93garbage", str(i).encode()] if i % 2 else [b"x"])
            await wait_until(lambda: server.stats().dropped_requests >= 300, timeout=20)
        finally:
            peer.close()
            ctx.term()
        assert server.stats().dropped_requests == 300
        if mode == "thread":  # a server process logs to its own stderr: the line count is checked here
            lines = [r for r in caplog.records if r.levelno >= logging.WARNING and "malformed" in r.getMessage()]
            assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
        client = RemotePolicy(server.address, b"good-client", timeout=10)
        try:
            assert (await ask(client))["action"].shape == (3, 1)
        finally:
            client.close()
        assert server.stats().requests == 1


def test_drop_reports_bound_the_peers_they_track() -> None:
    from acollect.inference._loop import DropReport

    report = DropReport(every=60.0, max_peers=2)
    assert report.dropped(b"a", now=0.0) == 1
    assert report.dropped(b"b", now=0.0) == 1
    assert report.dropped(b"c", now=1.0) == 1  # a third peer: the others' line
    assert report.dropped(b"d", now=2.0) is None  # shares it
    assert report.dropped(b"e", now=70.0) == 1  # a and b are forgotten after a minute: e is reported apart


@needs_curve
@pytest.mark.timeout(60)
async def test_keys_serve_an_allowed_client_and_refuse_and_count_the_others(keys: Path) -> None:
    stranger = ClientKeys.load(keys / "other", "stranger")
    impostor = ClientKeys(stranger.public, stranger.secret, ServerKeys.load(keys / "k").public)
    async with InferenceServer(policy(), address="tcp://127.0.0.1", keys=keys / "k", max_wait=0.001) as server:
        assert server.secure
        assert server.address is not None
        good = RemotePolicy(server.address, b"good", keys=ClientKeys.load(keys / "k", "good"), timeout=10)
        local = RemotePolicy(server.address, b"local", keys=server.local_client_keys(), timeout=10)
        try:
            assert (await ask(good))["action"].shape == (3, 1)
            assert (await ask(local))["action"].shape == (3, 1)
        finally:
            good.close()
            local.close()
        # An unlisted key, no CURVE at all, and a client holding another server's public key (RemotePolicy's socket).
        for name, client_keys in ((b"bad", impostor), (b"plain", None), (b"lost", stranger)):
            with WorkerSocket(server.address, name, keys=client_keys) as sock:
                with pytest.raises(TimeoutError):  # never connected: its request cannot even be queued
                    sock.send([b"let me in"], timeout=0.3)
        await wait_until(lambda: server.rejected_peers >= 3, timeout=10)
        assert server.stats().rejected_peers >= 3
        assert server.stats().requests == 2  # nothing of theirs was served
    assert server.rejected_peers >= 3  # still readable after close


@needs_curve
async def test_bad_keys_arguments_are_named(keys: Path) -> None:
    with pytest.raises(ConfigurationError, match="keys=42"):
        InferenceServer(policy(), address="tcp://127.0.0.1", keys=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="keys"):
        InferenceServer(policy(), keys=keys / "k")  # no address: nothing to guard
    with pytest.raises(ConfigurationError, match=r"collector\.key_secret"):
        InferenceServer(policy(), address="tcp://127.0.0.1", keys=keys / "missing")
    with pytest.raises(ConfigurationError, match="hang_timeout"):
        InferenceServer(policy(), hang_timeout=-1.0)
    async with InferenceServer(policy()) as server:
        with pytest.raises(CollectorStateError, match="keys"):
            server.local_client_keys()


class Sleeper(torch.nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return observation.sum(-1, keepdim=True)


@pytest.mark.timeout(60)
async def test_a_forward_pass_that_hangs_fails_the_server_naming_it() -> None:
    net = TensorDictModule(Sleeper(2.0), in_keys=["observation"], out_keys=["action"])
    async with InferenceServer(net, hang_timeout=0.3, max_wait=0.001) as server:
        with anyio.fail_after(10), pytest.raises(CollectorStateError) as info:
            await server.infer(observation())
        assert isinstance(info.value.__cause__, PolicyError)
        assert "the inference server is hung: a forward pass has run for" in str(info.value.__cause__)
        with pytest.raises(CollectorStateError, match="failed"):
            await server.infer(observation())
