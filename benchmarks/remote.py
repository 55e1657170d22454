"""Scale-out roads on one machine: the CartPole workload over tcp loopback, CURVE, torch.distributed.

Every contender is a lockstep collector with 2 workers x 16 CartPole-v1 envs and the
reference MLP (4-64-64-2, categorical sampling), 2048 frames per batch, so the only
difference is the road a batch and a weight push take:

* ``ipc``: the default, a private ipc socket (the reference: ratio 1.00);
* ``tcp``: ``address="tcp://127.0.0.1:0"``, no encryption;
* ``tcp+curve``: the same with ``keys=`` (every frame encrypted and authenticated);
* ``remote workers``: ``acollect worker`` processes joining over tcp with CURVE keys;
* ``gloo``: :class:`~acollect.DistributedSyncCollector`, batch tensors through torch.distributed.

Then the cost of one weight push to both workers (until both acknowledged), for the
reference MLP and for a 4M-parameter model (16 MB), per road: what a trainer pays per
update, and what grows with the number of workers (see ``docs/scaling.md``).

Run: ``python benchmarks/remote.py [--rounds 3] [--frames 60000] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import CategoricalMLPPolicy, machine_info, run_interleaved, single_thread_torch, write_json

from acollect import DistributedSyncCollector, MultiSyncCollector
from acollect.envs import GymEnv
from acollect.transport.auth import create_keys

_HERE = Path(__file__).resolve().parent
WORKERS, ENVS, FPB = 2, 16, 2048


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keys() -> Path:
    root = Path(tempfile.mkdtemp(prefix="acollect-bench-keys-"))
    create_keys(root, workers=["w0", "w1"])
    return root


def _start_remote(address: str, keys: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "acollect", "worker", "--connect", address, "--keys", str(keys)]
    return [subprocess.Popen([*cmd, "--name", f"w{i}"], env=env) for i in range(WORKERS)]


def _make(
    road: str, keys: Path, policy: torch.nn.Module | None = None, **kwargs: Any
) -> tuple[Any, list[subprocess.Popen[bytes]]]:
    env_fn = functools.partial(GymEnv, "CartPole-v1", num_envs=ENVS)
    common: dict[str, Any] = {"num_workers": WORKERS, "frames_per_batch": FPB, "startup_timeout": 60, **kwargs}
    policy = policy if policy is not None else CategoricalMLPPolicy()
    if road == "ipc":
        return MultiSyncCollector(env_fn, policy, **common), []
    if road == "tcp":
        return MultiSyncCollector(env_fn, policy, address="tcp://127.0.0.1:0", **common), []
    if road == "tcp+curve":
        return MultiSyncCollector(env_fn, policy, address="tcp://127.0.0.1:0", keys=keys, **common), []
    if road == "remote workers":
        address = f"tcp://127.0.0.1:{_free_port()}"
        collector = MultiSyncCollector(env_fn, policy, address=address, keys=keys, remote_workers=WORKERS, **common)
        return collector, _start_remote(address, keys)
    if road == "gloo":
        return DistributedSyncCollector(env_fn, policy, backend="gloo", **common), []
    raise ValueError(road)


def _finish(procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 30
    for proc in procs:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


async def _round(road: str, keys: Path, frames: int) -> tuple[int, float, float]:
    n_batches = max(1, frames // FPB)
    created = time.perf_counter()
    collector, procs = _make(road, keys, total_frames=(n_batches + 1) * FPB)
    try:
        async with collector:
            collected, first = 0, 0.0
            async for batch in collector:
                if not first:
                    first = time.perf_counter()  # the first batch pays for start-up: not timed
                    continue
                collected += batch.numel()
            seconds = time.perf_counter() - first
    finally:
        _finish(procs)
    return collected, seconds, first - created


class _Big(torch.nn.Module):
    """A 4M-parameter policy (16 MB of float32) that acts like the reference MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.small = CategoricalMLPPolicy()
        self.ballast = torch.nn.Parameter(torch.zeros(4_000_000))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.small(observation)


async def _push(road: str, keys: Path, big: bool, reps: int) -> list[float]:
    collector, procs = _make(road, keys, policy=_Big() if big else CategoricalMLPPolicy(), total_frames=-1)
    times = []
    try:
        async with collector:
            for _ in range(reps + 1):
                start = time.perf_counter()
                await collector.update_policy_weights_()  # the policy given: serialized, sent, acknowledged
                times.append(time.perf_counter() - start)
    finally:
        _finish(procs)
    return times[1:]  # the first push sets up segments and writers


ROADS = ("ipc", "tcp", "tcp+curve", "remote workers", "gloo")

# One sender process blasting batch messages at the collector's endpoint: how many a collector
# can take in per second (unpacked, as the pool does), i.e. its fan-in ceiling.
_SENDER = """
import sys, torch
from tensordict import TensorDict
from acollect.transport.auth import ClientKeys
from acollect._runtime.endpoint import WorkerSocket
from acollect._runtime.wire import pack_message
address, nbytes, count, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
td = TensorDict({"x": torch.zeros(nbytes // 4)}, batch_size=[])
msg = pack_message("batch", {"worker": 0, "gen": 1}, td)
with WorkerSocket(address, b"s", keys=ClientKeys.load(keys, "w0") if keys != "-" else None) as sock:
    for _ in range(count):
        sock.send(msg, timeout=60)
    sock.recv(timeout=60)  # linger is 0: stay until everything was taken
"""


async def _fanin(road: str, keys: Path, nbytes: int, count: int) -> float:
    from acollect._runtime.endpoint import Endpoint
    from acollect._runtime.wire import unpack_message
    from acollect.transport.auth import ServerKeys

    address = None if road == "ipc" else "tcp://127.0.0.1:0"
    async with Endpoint(address, keys=ServerKeys.load(keys) if road == "tcp+curve" else None) as endpoint:
        key_arg = str(keys) if road == "tcp+curve" else "-"
        cmd = [sys.executable, "-c", _SENDER, endpoint.address, str(nbytes), str(count), key_arg]
        sender = subprocess.Popen(cmd)  # noqa: ASYNC220 - started once, before the timed part
        try:
            await endpoint.recv(timeout=60)
            start = time.perf_counter()
            for _ in range(count - 1):
                _, frames = await endpoint.recv(timeout=60)
                unpack_message(frames)
            seconds = time.perf_counter() - start
            await endpoint.send(b"s", [b"done"])
        finally:
            _finish([sender])
    return (count - 1) / seconds


def fanin(args: argparse.Namespace, keys: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sizes = {"CartPole part, 1024 frames (82 KB)": 82_000, "4 MB": 4_000_000}
    print(f"\n{'collector fan-in, messages/s':<30}" + "".join(f"{k:>36}" for k in sizes))
    for road in ("ipc", "tcp", "tcp+curve"):
        rates = {k: statistics.median(asyncio.run(_fanin(road, keys, n, args.fanin_count)) for _ in range(args.rounds))
                 for k, n in sizes.items()}  # fmt: skip
        out[road] = {k: {"messages_per_s": r, "GB_per_s": r * sizes[k] / 1e9} for k, r in rates.items()}
        cells = "".join(f"{f'{r:,.0f} ({r * sizes[k] / 1e9:.2f} GB/s)':>36}" for k, r in rates.items())
        print(f"{road:<30}{cells}")
    return out


def throughput(args: argparse.Namespace, keys: Path) -> dict[str, Any]:
    def contender(road: str) -> Callable[[], tuple[int, float, float]]:
        return lambda: asyncio.run(_round(road, keys, args.frames))

    results = run_interleaved([(road, contender(road)) for road in ROADS], args.rounds)
    base = results[0].median
    print(f"\n{'road':<16}{'frames/s':>12}{'vs ipc':>9}{'start-up s':>12}")
    out = {}
    for r in results:
        print(f"{r.name:<16}{r.median:>12,.0f}{r.median / base:>9.2f}{statistics.median(r.startup_s):>12.1f}")
        out[r.name] = {**r.as_dict(), "ratio_to_ipc": r.median / base}
    return out


def weights(args: argparse.Namespace, keys: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print(f"\n{'weight push to 2 workers':<26}{'MLP (17 KB) ms':>16}{'4M params (16 MB) ms':>22}")
    for road in ROADS:
        small = asyncio.run(_push(road, keys, False, args.weight_reps))
        large = asyncio.run(_push(road, keys, True, args.weight_reps))
        s = statistics.median(small) * 1e3 if small else float("nan")
        g = statistics.median(large) * 1e3 if large else float("nan")
        print(f"{road:<26}{s:>16.2f}{g:>22.1f}")
        out[road] = {"mlp_ms": s, "big_ms": g}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=60_000, help="timed frames per round")
    parser.add_argument("--weight-reps", type=int, default=10)
    parser.add_argument("--fanin-count", type=int, default=2000, help="messages per fan-in round")
    parser.add_argument(
        "--only", nargs="*", choices=["throughput", "weights", "fanin"], default=["throughput", "weights", "fanin"]
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    single_thread_torch()
    keys = _keys()
    parts = {"throughput": throughput, "weights": weights, "fanin": fanin}
    try:
        results = {name: parts[name](args, keys) for name in args.only}
    finally:
        shutil.rmtree(keys, ignore_errors=True)  # secret keys: none left in the temporary directory
    payload = {"benchmark": "remote", "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_info(),
               "results": results}  # fmt: skip
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
