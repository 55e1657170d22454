"""The inference server process is owned like a worker: its crash, its hang, its owner's death, a cancelled start."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import psutil
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector, CollectorState, InferenceServer
from acollect.errors import CollectorStateError, InferencePolicyError, InferenceServerError, PolicyError
from acollect.testing import CountingEnv, assert_counting_batch, wait_until

ENVS = [functools.partial(CountingEnv, num_envs=2, episode_length=5, start=1000 * k) for k in range(2)]


def policy() -> TensorDictModule:
    return TensorDictModule(torch.nn.Linear(1, 1), in_keys=["observation"], out_keys=["action"])


def counting_policy() -> TensorDictModule:
    class Zero(torch.nn.Module):
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return torch.zeros(observation.shape[0], dtype=torch.long)

    return TensorDictModule(Zero(), in_keys=["observation"], out_keys=["action"])


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(120)
async def test_a_killed_server_process_breaks_the_collector_with_its_exit_code(start_method: str) -> None:
    collector = AsyncBatchedCollector(ENVS, counting_policy(), frames_per_batch=8, start_method=start_method)
    try:
        with anyio.fail_after(60):
            assert_counting_batch(await anext(collector))
            pid = collector.server.pid
            assert pid is not None
            assert pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(InferenceServerError, match=r"inference server process \(pid \d+\) died: killed by "
                               r"signal 9") as info:  # fmt: skip
                async for _ in collector:
                    pass
        assert info.value.exitcode == -signal.SIGKILL
        assert info.value.pid == pid
        assert not isinstance(info.value, PolicyError), "a dead server is something else's failure, not the policy's"
        assert collector.state is CollectorState.BROKEN
    finally:
        await collector.async_shutdown()
    assert not alive(pid)


async def test_a_killed_server_process_fails_its_waiting_callers_and_later_calls() -> None:
    async with InferenceServer(policy(), max_wait=0.0) as server:
        obs = TensorDict({"observation": torch.ones(2, 1)}, batch_size=[2])
        await server.infer(obs)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            await wait_until(lambda: not server.running, timeout=5)
        failed = r"infer\(\): the inference server failed \(.*killed by signal 9"
        with pytest.raises(CollectorStateError, match=failed) as info:
            await server.infer(obs)
        cause = info.value.__cause__
        assert isinstance(cause, InferenceServerError)
        assert not isinstance(cause, PolicyError)
        assert cause.exitcode == -signal.SIGKILL


def test_a_killed_trainer_leaves_no_server_process_and_nothing_it_bound(tmp_path: Path) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent("""
        import anyio, sys, torch
        from tensordict.nn import TensorDictModule
        from acollect import InferenceServer

        async def main():
            net = TensorDictModule(torch.nn.Linear(1, 1), in_keys=["observation"], out_keys=["action"])
            async with InferenceServer(net, address="ipc") as server:
                print(server.pid, server.address, server.slot_address, flush=True)
                await anyio.sleep(120)

        anyio.run(main)
    """)
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout is not None
        pid_text, address, slots = trainer.stdout.readline().split()
        pid = int(pid_text)
        assert alive(pid)
        assert os.path.exists(address.removeprefix("ipc://"))
        assert os.path.exists(slots)
        trainer.kill()  # SIGKILL: nothing of the trainer's runs to clean up
        trainer.wait(10)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(pid), "the server process outlived its trainer"
        assert not os.path.exists(slots), "the slot listener's socket is left behind"
        assert not os.path.exists(address.removeprefix("ipc://")), "the server's ipc path is left behind"
    finally:
        trainer.kill()
        trainer.wait(10)
        if trainer.stdout is not None:
            trainer.stdout.close()


@pytest.mark.timeout(120)
async def test_a_cancelled_start_leaves_no_server_process() -> None:
    me = psutil.Process()
    rng = random.Random(7)
    for deadline in (0.0, 0.02, *(rng.uniform(0.05, 1.5) for _ in range(4))):
        server = InferenceServer(policy(), address="ipc")
        with anyio.move_on_after(deadline) as scope:
            await server.start()
        await server.async_shutdown()
        if scope.cancelled_caught:
            assert server.address is None or not server.running
        assert not [p for p in me.children() if "inference.process_main" in " ".join(p.cmdline())], deadline


@pytest.mark.timeout(120)
async def test_a_cancelled_collector_set_up_leaves_no_server_process(start_method: str) -> None:
    me = psutil.Process()
    for deadline in (0.3, 1.2):
        collector = AsyncBatchedCollector(ENVS, counting_policy(), frames_per_batch=8, start_method=start_method)
        with anyio.move_on_after(deadline):
            await anext(collector)
        await collector.async_shutdown()
        assert not [p for p in me.children() if "inference.process_main" in " ".join(p.cmdline())], deadline


async def test_weights_reach_the_next_pass_of_the_server_process() -> None:
    net = policy()
    async with InferenceServer(net, max_wait=0.0) as server:
        obs = TensorDict({"observation": torch.ones(3, 1)}, batch_size=[3])
        with torch.no_grad():
            net.module.weight.fill_(2.0)
            net.module.bias.fill_(1.0)
        assert await server.update_policy_weights_(net) == 1
        out = await server.infer(obs)
        assert out["action"].flatten().tolist() == [3.0, 3.0, 3.0]
        assert server.stats().policy_version == server.version == 1
        with torch.no_grad():
            net.module.bias.fill_(-1.0)
        assert await server.update_policy_weights_(weights=dict(net.module.state_dict())) == 2
        assert (await server.infer(obs))["action"].flatten().tolist() == [1.0, 1.0, 1.0]


async def test_an_unpicklable_policy_is_a_clear_error_naming_the_way_out() -> None:
    import threading

    class Locked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return observation

    net = TensorDictModule(Locked(), in_keys=["observation"], out_keys=["action"])
    server = InferenceServer(net)
    with pytest.raises(Exception, match=r"policy_factory.*mode='thread'"):
        await server.start()
    await server.async_shutdown()
    # The ways out: a factory (called in the server, here in a thread of this process, so nothing is sent).
    async with InferenceServer(policy_factory=lambda: net, mode="thread") as server:
        out = await server.infer(TensorDict({"observation": torch.ones(2, 1)}, batch_size=[2]))
        assert out["action"].shape == (2, 1)


def test_bad_modes_are_named() -> None:
    from acollect import ConfigurationError

    with pytest.raises(ConfigurationError, match="mode"):
        InferenceServer(policy(), mode="fork")
    with pytest.raises(ConfigurationError, match="server"):
        AsyncBatchedCollector(ENVS, policy(), frames_per_batch=8, server="gpu")
    with pytest.raises(ConfigurationError, match="num_threads"):
        InferenceServer(policy(), num_threads=0)


def _broken_factory() -> torch.nn.Module:
    raise RuntimeError("no policy today")


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_a_policy_that_fails_to_build_fails_the_start_and_leaves_nothing(mode: str) -> None:
    server = InferenceServer(policy_factory=_broken_factory, address="ipc", mode=mode)
    expected = InferencePolicyError if mode == "process" else RuntimeError  # the policy's factory raised
    with anyio.fail_after(60), pytest.raises(expected, match="no policy today"):
        await server.start()
    await server.async_shutdown()  # the way out of a failed start; the leak check then finds nothing


async def test_a_server_process_that_cannot_bind_fails_with_its_own_error_not_the_policys(tmp_path: Path) -> None:
    server = InferenceServer(policy(), address=f"ipc://{tmp_path}/no-such-dir/server.sock")
    with anyio.fail_after(60), pytest.raises(InferenceServerError, match="an address this process can bind") as info:
        await server.start()
    assert not isinstance(info.value, PolicyError)
    assert info.value.type_name == "acollect.errors.ConfigurationError"
    await server.async_shutdown()
