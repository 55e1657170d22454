"""Workers started by hand (``python -m acollect worker``) joining a collector over CURVE-authenticated tcp."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch

from acollect import ConfigurationError, MultiAsyncCollector, MultiSyncCollector
from acollect._workers.handles import WorkerState
from acollect._workers.remote import join
from acollect.testing import assert_counting_batch, wait_until
from acollect.transport.auth import ClientKeys, ServerKeys, create_keys, curve_available

pytestmark = [
    pytest.mark.skipif(not curve_available(), reason="libzmq without CURVE"),
    pytest.mark.timeout(120),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(address: str, keys: Path, name: str, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "acollect", "worker", "--connect", address, "--keys", str(keys), "--name", name]
    return subprocess.Popen([*cmd, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    codes = []
    for proc in procs:
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=5)
        codes.append(proc.returncode)
    return codes


@pytest.fixture
def keydirs(tmp_path: Path) -> tuple[Path, Path]:
    """An allowed key directory (workers a, b) and an intruder's (right collector key, unlisted own key)."""
    good, bad = tmp_path / "keys", tmp_path / "intruder"
    create_keys(good, workers=["a", "b"])
    create_keys(bad, workers=["intruder"])
    shutil.copyfile(good / "collector.key", bad / "collector.key")  # it knows whom to call, not a listed key
    return good, bad


@pytest.mark.slow  # three fresh interpreters, one of which waits to be refused
async def test_two_remote_workers_and_a_refused_intruder(keydirs: tuple[Path, Path]) -> None:
    good, bad = keydirs
    address = f"tcp://127.0.0.1:{_free_port()}"

    class Probe(torch.nn.Module):  # defined here, so it travels by value (pickled) to the remote workers
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return (observation[..., 0] * 0 + self.w).clamp(0, 1).long()

    policy = Probe()
    workers = [_worker(address, good, "a"), _worker(address, good, "b")]
    intruder = None
    try:
        async with MultiSyncCollector(
            "CartPole-v1", policy, num_workers=2, remote_workers=2, address=address, keys=good,
            frames_per_batch=64, env_kwargs={"num_envs": 2}, startup_timeout=60,
        ) as collector:  # fmt: skip
            assert collector.worker_pids == [None, None]  # not our processes
            batches = 0
            intruder = _worker(address, bad, "intruder", "--join-timeout", "3")
            async for batch in collector:
                assert batch.shape == (2, 2, 16)
                assert bool((batch["action"] == 0).all())
                assert not batch["next", "reward"].isnan().any()
                batches += 1
                if collector.rejected_peers >= 1 and intruder.poll() is not None:
                    break
            _, err = intruder.communicate(timeout=5)
            assert intruder.returncode == 1, err  # it gave up; the collector never heard from it
            assert b"could not connect" in err
            # Refused and counted; collection goes on, and weights still reach both workers.
            with torch.no_grad():
                policy.w.fill_(1.0)
            version = await collector.update_policy_weights_()
            # The batch begun ahead of the push may still carry the previous version; the ones after it do not.
            more = [b async for b in _take(collector, 3)]
            assert int(more[0]["collector", "policy_version"].min()) >= version - 1
            assert all(int(b["collector", "policy_version"].min()) == version for b in more[1:])
            assert all(bool((b["action"] == 1).all()) for b in more[1:])  # the pushed weights act
            assert collector.rejected_peers >= 1
            assert batches >= 1
    finally:
        codes = _stop(workers + ([intruder] if intruder is not None else []))
    assert codes[:2] == [0, 0]  # the collector stopped them


async def _take(collector: MultiSyncCollector, n: int):  # type: ignore[no-untyped-def]
    i = 0
    async for batch in collector:
        yield batch
        i += 1
        if i == n:
            return


async def test_import_path_config_without_pickle(keydirs: tuple[Path, Path]) -> None:
    good, _ = keydirs
    address = f"tcp://127.0.0.1:{_free_port()}"
    workers = [_worker(address, good, "a", "--no-pickle")]
    try:
        async with MultiAsyncCollector(
            "acollect.testing:CountingEnv", policy_factory=None, num_workers=2, remote_workers=1, address=address,
            keys=good, frames_per_batch=8, total_frames=-1, startup_timeout=60,
        ) as collector:  # fmt: skip
            ids: set[int] = set()
            with anyio.fail_after(60):  # on a loaded machine the local worker may hand in many batches first
                async for batch in collector:
                    ids.add(int(batch["collector", "worker_id"][0, 0]))
                    if ids == {0, 1}:  # one local worker, one started by hand
                        break
    finally:
        codes = _stop(workers)
    assert codes == [0]


async def test_a_remote_slot_is_given_once(keydirs: tuple[Path, Path]) -> None:
    good, _ = keydirs
    address = f"tcp://127.0.0.1:{_free_port()}"
    workers = [_worker(address, good, "a")]
    try:
        async with MultiSyncCollector(
            "acollect.testing:CountingEnv", num_workers=1, remote_workers=1, address=address, keys=good,
            frames_per_batch=4, startup_timeout=60,
        ) as collector:  # fmt: skip
            assert collector.endpoint_address == address
            with pytest.raises(ConfigurationError, match="every remote worker slot"):
                await _join_in_thread(address, ClientKeys.load(good, "b"))
            async for batch in collector:
                assert batch.shape == (1, 1, 4)
                break
    finally:
        codes = _stop(workers)
    assert codes == [0]


async def _join_in_thread(address: str, keys: ClientKeys) -> object:
    import anyio.to_thread

    return await anyio.to_thread.run_sync(lambda: join(address, keys, timeout=10))


def test_remote_workers_need_keys_and_an_address(keydirs: tuple[Path, Path]) -> None:
    good, _ = keydirs
    with pytest.raises(ConfigurationError, match="remote_workers"):
        MultiSyncCollector("CartPole-v1", num_workers=2, remote_workers=1, frames_per_batch=8, keys=good)
    with pytest.raises(ConfigurationError, match="remote_workers"):
        MultiSyncCollector(
            "CartPole-v1", num_workers=2, remote_workers=1, frames_per_batch=8, address="tcp://127.0.0.1:1"
        )
    with pytest.raises(ConfigurationError, match="remote_workers"):
        MultiSyncCollector("CartPole-v1", num_workers=1, remote_workers=2, frames_per_batch=8)
    with pytest.raises(ConfigurationError, match="no secret key file"):
        MultiSyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8, keys=good / "authorized")
    assert isinstance(ServerKeys.load(good), ServerKeys)
    assert "secret" not in repr(ServerKeys.load(good))


async def test_a_dead_remote_worker_is_replaced_by_the_next_to_join(keydirs: tuple[Path, Path]) -> None:
    good, _ = keydirs
    address = f"tcp://127.0.0.1:{_free_port()}"
    first = _worker(address, good, "a")
    second = None
    try:
        async with MultiSyncCollector(
            "acollect.testing:CountingEnv", num_workers=1, remote_workers=1, address=address, keys=good,
            frames_per_batch=4, heartbeat_timeout=2, max_worker_restarts=1, startup_timeout=60,
        ) as collector:  # fmt: skip
            batches = _take(collector, 2)
            await batches.__anext__()
            first.kill()  # no process handle here: only its silence tells
            await wait_until(lambda: collector.stats().restarts == 1, timeout=30)  # its slot is free again
            second = _worker(address, good, "b")
            batch = await batches.__anext__()  # from the worker that took the freed slot
            assert batch.shape == (1, 1, 4)
            await batches.aclose()
    finally:
        codes = _stop([first] + ([second] if second is not None else []))
    assert codes[1] == 0


async def test_a_remote_worker_that_leaves_is_lost_and_the_local_one_collects_on(keydirs: tuple[Path, Path]) -> None:
    good, _ = keydirs
    address = f"tcp://127.0.0.1:{_free_port()}"
    worker = _worker(address, good, "a")
    try:
        async with MultiSyncCollector(
            "acollect.testing:CountingEnv", num_workers=2, remote_workers=1, address=address, keys=good,
            frames_per_batch=8, heartbeat_timeout=2, startup_timeout=60, on_worker_loss="continue",
        ) as collector:  # fmt: skip
            assert collector.pool is not None
            remote = next(h.index for h in collector.pool.handles if h.config.remote)
            with anyio.fail_after(60):
                assert (await anext(collector)).shape == (2, 1, 4)
            worker.kill()  # no process handle here: only its silence tells; nobody takes its slot
            await wait_until(lambda: collector.stats().lost_workers == 1, timeout=30)
            assert collector.worker_states[remote] is WorkerState.LOST
            with anyio.fail_after(30):
                for _ in range(3):
                    batch = await anext(collector)
                    assert batch.shape == (1, 1, 4)  # the local worker's part
                    assert_counting_batch(batch)
    finally:
        _stop([worker])
