"""AsyncBatchedCollector on tcp with keys, and a forward pass that hangs reported as the server's hang."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, CollectorState
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.worker_socket import WorkerSocket
from acollect.errors import PolicyError
from acollect.testing import CountingEnv, wait_until
from acollect.transport.auth import create_keys, curve_available

ENVS = [functools.partial(CountingEnv, num_envs=2, episode_length=5)] * 2


class Parity(torch.nn.Module):
    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0].long() % 2


@pytest.mark.skipif(not curve_available(), reason="libzmq without CURVE")
@pytest.mark.timeout(120)
async def test_keys_and_a_tcp_address_collect_and_the_servers_refusals_are_counted(
    tmp_path: Path, start_method: str
) -> None:
    create_keys(tmp_path / "k", workers=["a"])
    policy = TensorDictModule(Parity(), in_keys=["observation"], out_keys=["action"])
    async with AsyncBatchedCollector(
        ENVS, policy, frames_per_batch=8, total_frames=32, address="tcp://127.0.0.1:0", keys=tmp_path / "k",
        start_method=start_method,
    ) as collector:  # fmt: skip
        batches = [await anext(collector) for _ in range(4)]  # all of total_frames, the iterator not ended yet
        assert sum(batch.numel() for batch in batches) == 32
        server = collector.server
        assert server.secure
        assert server.address is not None
        assert server.address.startswith("tcp://127.0.0.1:")
        assert collector.stats().inference["rows"] >= 32
        with WorkerSocket(server.address, b"intruder") as intruder:  # no CURVE: refused at the handshake
            with pytest.raises(TimeoutError):
                intruder.send([b"let me in"], timeout=0.3)
        await wait_until(lambda: collector.rejected_peers >= 1, timeout=10)
        assert collector.stats().inference["rejected_peers"] >= 1


class Hangs(torch.nn.Module):
    calls = 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        if type(self).calls > 3:  # after the workers' first probe steps: mid-collection
            time.sleep(4.0)
        return torch.zeros(observation.shape[0], dtype=torch.long)


@pytest.mark.timeout(120)
async def test_a_forward_pass_that_hangs_breaks_the_collector_naming_the_server(start_method: str) -> None:
    policy = TensorDictModule(Hangs(), in_keys=["observation"], out_keys=["action"])
    collector = AsyncBatchedCollector(
        ENVS, policy, frames_per_batch=8, heartbeat_timeout=1.0, start_method=start_method
    )
    with anyio.fail_after(60):
        with pytest.raises(PolicyError, match=r"the inference server at \S+ is hung: a forward pass has run for"):
            async for _ in collector:
                pass
        assert collector.state is CollectorState.BROKEN
        await collector.async_shutdown()


def test_no_secret_key_for_the_inference_server_is_sent_to_a_worker_started_by_hand() -> None:
    import zmq

    from acollect._workers import protocol as P
    from acollect._workers.config_codec import encode_config
    from acollect.transport.auth import ClientKeys

    public, secret = zmq.curve_keypair()
    config = P.WorkerConfig(
        index=0, generation=1, n_workers=1, address="tcp://127.0.0.1:1", parent_pid=0,
        rollout=RolloutSpec(create_env_fn="acollect.testing:CountingEnv", frames_per_batch=1),
        inference={"address": "tcp://127.0.0.1:2", "keys": ClientKeys(public, secret, public)},
    )  # fmt: skip
    fields, payload = encode_config(config, allow_pickle=False)
    assert payload is None
    assert fields["plain"]["inference"] == {"address": "tcp://127.0.0.1:2"}  # the worker uses its own keys
    assert config.inference is not None
    assert "keys" in config.inference  # the collector's copy is left alone
