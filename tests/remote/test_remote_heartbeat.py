"""The collector's heartbeat: a worker started by hand notices a collector that died, froze or stalled.

Real processes and sockets: a trainer in a subprocess, an ``acollect worker`` in another, and
signals between them. Also: a batch a dead ``MultiAsyncCollector`` worker sent, arriving after its
death was noticed, is counted in ``dropped_batches`` (once).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from acollect import MultiAsyncCollector
from acollect._runtime.wire import PROTOCOL_VERSION, encode_tensordict, pack_message, unpack_message
from acollect._runtime.worker_socket import WorkerSocket
from acollect._weights.updates import encode_structure
from acollect._workers import protocol as P
from acollect._workers.remote import join
from acollect.testing import wait_until
from acollect.transport.auth import ClientKeys, create_keys, curve_available

pytestmark = [
    pytest.mark.skipif(not curve_available(), reason="libzmq without CURVE"),
    pytest.mark.timeout(120),
]

TRAINER = textwrap.dedent(
    """
    import sys
    import anyio
    from acollect import MultiAsyncCollector

    async def main():
        address, keys, heartbeat_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
        async with MultiAsyncCollector(
            "acollect.testing:CountingEnv", num_workers=1, remote_workers=1, address=address, keys=keys,
            frames_per_batch=8, heartbeat_timeout=heartbeat_timeout, startup_timeout=60,
        ) as collector:
            async for _ in collector:
                print("collecting", flush=True)
                break
            async for _ in collector:
                await anyio.sleep(0.01)

    anyio.run(main)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    create_keys(tmp_path / "keys", workers=["a"])
    return tmp_path / "keys"


def _worker(address: str, keys: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "acollect", "worker", "--connect", address, "--keys", str(keys), "--name", "a"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _trainer(address: str, keys: Path, heartbeat_timeout: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, address, str(keys), str(heartbeat_timeout)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _wait_collecting(trainer: subprocess.Popen[str]) -> None:
    assert trainer.stdout is not None
    assert trainer.stdout.readline().strip() == "collecting", "the trainer ended before its first batch"


def _exit_time(worker: subprocess.Popen[str], since: float, limit: float = 60) -> tuple[float, str]:
    """Seconds from ``since`` until the worker exited (it must, within ``limit``: a deadline only a worker that never
    notices misses), and its stderr."""
    try:
        _, err = worker.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, err = worker.communicate(timeout=5)
        pytest.fail(f"the worker outlived its collector by {limit}s; its stderr:\n{err}")
    return time.monotonic() - since, err


def _end(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_a_killed_trainer_ends_its_hand_started_worker(keys: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    # A heartbeat_timeout of an hour: a dead collector's connection is down at once, and that is what its worker
    # notices (it says so), not the silence.
    trainer, worker = _trainer(address, keys, 3600.0), _worker(address, keys)
    try:
        _wait_collecting(trainer)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        _, err = _exit_time(worker, time.monotonic())
    finally:
        _end(trainer, worker)
    assert worker.returncode == 1
    gone = [line for line in err.splitlines() if "is gone" in line]
    assert len(gone) == 1, err
    assert f"the collector at {address} is gone (the connection to it is down" in gone[0]
    assert "Traceback" not in err, err


def test_a_frozen_trainer_ends_its_worker_after_heartbeat_timeout(keys: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    # SIGSTOP freezes the whole trainer, ZeroMQ's threads too; its connection stays up for ZeroMQ's
    # own 10 s heartbeat timeout, so only the collector's silence tells.
    trainer, worker = _trainer(address, keys, 3.0), _worker(address, keys)
    try:
        _wait_collecting(trainer)
        trainer.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        took, err = _exit_time(worker, stopped)
    finally:
        _end(trainer, worker)
    assert worker.returncode == 1
    # Left for the collector's silence (ZeroMQ's own heartbeats would have said the connection is down), and not
    # before heartbeat_timeout: its last message came at most a heartbeat interval (0.5 s) before the freeze.
    silence = re.search(r"is gone \(nothing came from it for ([0-9.]+)s \(heartbeat_timeout=3s\)\)", err)
    assert silence is not None, err
    assert float(silence[1]) >= 3.0
    assert took >= 2.0, f"the worker left {took:.1f}s after the trainer froze"


def _block(seconds: float) -> None:
    time.sleep(seconds)  # the trainer's own synchronous work, holding its event loop


async def test_a_stalled_trainer_keeps_its_worker(keys: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    worker = _worker(address, keys)
    try:
        async with MultiAsyncCollector(
            "acollect.testing:CountingEnv", num_workers=1, remote_workers=1, address=address, keys=keys,
            frames_per_batch=8, heartbeat_timeout=8, startup_timeout=60,
        ) as collector:  # fmt: skip
            await anext(collector)
            # Longer than the worker's grace for a dropped connection, shorter than heartbeat_timeout:
            # the connection stays up, so the worker waits.
            _block(4.0)
            for _ in range(3):
                await anext(collector)
            assert worker.poll() is None
        _, err = worker.communicate(timeout=20)
    finally:
        _end(worker)
    assert worker.returncode == 0, err  # stopped by its collector
    assert "is gone" not in err


class _FakeWorker(threading.Thread):
    """A hand-started worker speaking the protocol step by step, so a batch can be made to arrive late.

    It joins, says hello, sends batch 0 and a heartbeat saying it is busy with batch 1, then falls
    silent; once the collector has given it up (``dead``), it sends batch 1 (the one counted at its
    death), batch 2, batch 2 again (a replay) and batch 3, on one socket, so in that order; it closes its sockets
    once the test has seen them (``seen``).
    """

    def __init__(self, address: str, keys: ClientKeys) -> None:
        super().__init__(name="fake-worker", daemon=True)
        self.address, self.keys = address, keys
        self.dead, self.seen, self.done = threading.Event(), threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        from acollect._workers.worker_engine import build_engine
        from acollect.stats import EpisodeTracker

        config = join(self.address, self.keys, timeout=30)
        engine = build_engine(config)
        fields = {"worker": config.index, "gen": config.generation}
        identity = P.worker_identity(config.index, config.generation)
        with (
            WorkerSocket(config.address, identity, keys=config.keys) as control,
            WorkerSocket(config.address, identity + b"d", keys=config.keys) as data,
        ):

            def beat(busy: bool, sent: int) -> None:
                control.send(pack_message(P.HEARTBEAT, {**fields, "steps": engine.steps, "busy": busy, "sent": sent}))

            layout, _ = encode_tensordict(engine.allocate())
            hello = {"pid": os.getpid(), "protocol": PROTOCOL_VERSION, "n_envs": engine.n_envs, "layout": layout,
                     "frames_per_batch": engine.frames_per_batch,
                     "weights": encode_structure(engine.policy.weights_module)}  # fmt: skip
            control.send(pack_message(P.HELLO, {**fields, **hello}))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the collector says run
                beat(False, 0)
                frames = control.recv(timeout=0.1)
                if frames is not None and unpack_message(frames)[0]["kind"] == P.RUN:
                    break
            else:
                raise TimeoutError("the collector never said run")
            tracker = EpisodeTracker()

            def batch(seq: int) -> list[bytes]:
                td = engine.collect(threading.Event())
                header = {
                    "seq": seq,
                    "policy_version": engine.policy_version,
                    "traj_counter": engine.next_traj_counter,
                    "frames": engine.frames,
                    "slot": None,
                    "episodes": tracker.update(td).to_header(),
                }
                return pack_message(P.BATCH, {**fields, **header}, td)

            data.send(batch(0), copy=True)
            beat(True, 1)  # busy with batch 1; then silence
            if not self.dead.wait(30):
                raise TimeoutError("the collector never gave this worker up")
            late = [batch(1), batch(2)]
            for frames in [*late, late[1], batch(3)]:
                data.send(frames, copy=True)
            if not self.seen.wait(30):  # closed at once, the sockets would drop what is not on the wire yet
                raise TimeoutError("the collector never saw the late batches")


async def test_a_late_batch_from_a_dead_async_worker_is_counted_once(
    keys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="acollect")
    address = f"tcp://127.0.0.1:{_free_port()}"
    fake = _FakeWorker(address, ClientKeys.load(keys, "a"))
    fake.start()
    try:
        async with MultiAsyncCollector(
            "acollect.testing:CountingEnv", num_workers=1, remote_workers=1, address=address, keys=keys,
            frames_per_batch=4, heartbeat_timeout=1, max_worker_restarts=1, startup_timeout=60,
        ) as collector:  # fmt: skip
            first = await anext(collector)
            assert first.shape == (1, 4)
            await wait_until(lambda: collector.stats().restarts == 1, timeout=20)
            assert collector.dropped_batches == 1  # the batch it was busy with at its last heartbeat
            fake.dead.set()
            # Batch 3, sent after the replay on the same socket, is dropped (and logged) after it: once it shows,
            # everything before it was processed.
            await wait_until(lambda: "dropped batch 3 of worker 0's previous process" in caplog.text, timeout=30)
            fake.seen.set()
            await wait_until(fake.done.is_set, timeout=30)
            assert fake.error is None, fake.error
            # Batch 1 was the one counted at its death; batches 2 and 3 arrived late: dropped and counted; the
            # replay of batch 2 is not counted again.
            assert collector.dropped_batches == 3
    finally:
        fake.dead.set()
        fake.seen.set()
        fake.join(timeout=30)
