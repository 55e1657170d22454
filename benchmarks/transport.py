"""Transport throughput: in-process copy vs ZeroMQ frames vs shared-memory slots, and a weight push.

For each payload size (256 KiB, 4 MiB, 28 MiB: about a pixel batch of 84x84x4 uint8
frames, 16 envs x 25 steps, with next observations) the same bytes travel three ways:

(a) ``copy_``   one in-process ``tensor.copy_`` of the payload: the ceiling.
(b) ``zmq``     a worker process sends the payload as raw frames (``pack_message``) over
                ipc to the collector's asyncio :class:`~acollect.transport.Endpoint`,
                which decodes it without a copy (``unpack_message``).
(c) ``shm``     the worker writes the payload into a shared-memory slot of a 2-slot ring
                and sends a small "ready" message; the collector copies the slot out into
                a buffer it already holds (``read(out=...)``) and hands the slot back.
    ``shm_alloc``  the same, copied out into fresh tensors (``read()``).

(b) and (c) run with 2 credits (two batches in flight) and are timed at the collector
from the first credit to the last batch, so the figure is delivered bytes per second.

Then a weight push: a 10M-parameter MLP is flattened into a shared-memory segment, two
workers are told to copy it into their own copy of the MLP, and the push ends when both
acknowledged; compared with one in-process copy of the parameters.

Run: ``python benchmarks/transport.py [--rounds 3] [--json results/transport.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

from _common import machine_info, single_thread_torch, write_json

from acollect.transport import (
    Endpoint,
    ShmSegment,
    ShmSlotRing,
    WorkerSocket,
    encode_tensordict,
    flatten_params,
    pack_message,
    unflatten_into,
    unpack_message,
)

SIZES = {"256 KiB": 256 << 10, "4 MiB": 4 << 20, "28 MiB": 28 << 20}
BYTES_PER_ROUND = 512 << 20  # each contender moves about this much per round
CREDITS = 2
DEADLINE = 120.0


def payload(nbytes: int) -> TensorDict:
    return TensorDict({"pixels": torch.randint(0, 256, (nbytes,), dtype=torch.uint8)}, batch_size=[])


def big_mlp() -> nn.Module:
    """About 10.5M float32 parameters (42 MB)."""
    torch.manual_seed(0)
    sizes = [512, 2048, 2048, 2048, 512]
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


# --------------------------------------------------------------------------- worker process


def worker_main(address: str, identity: bytes) -> None:
    """Serves the collector's commands until told to stop."""
    single_thread_torch()
    with WorkerSocket(address, identity) as sock:
        sock.send(pack_message("hello"), timeout=DEADLINE)
        policy: nn.Module | None = None
        weights: ShmSegment | None = None
        while True:
            frames = sock.recv(timeout=DEADLINE)
            if frames is None:
                raise SystemExit("no command from the collector")
            header, _ = unpack_message(frames)
            kind = header["kind"]
            if kind == "stop":
                break
            if kind == "zmq_stream":
                data = payload(header["nbytes"])
                for seq in range(header["count"]):
                    wait_for_credit(sock)
                    sock.send(pack_message("batch", {"seq": seq}, data), timeout=DEADLINE)
            elif kind == "shm_stream":
                data = payload(header["nbytes"])
                with ShmSlotRing.attach(header["names"], header["layout"]) as ring:
                    for seq in range(header["count"]):
                        slot = wait_for_credit(sock)
                        ring[slot].write(data)
                        sock.send(pack_message("ready", {"seq": seq, "slot": slot}), timeout=DEADLINE)
            elif kind == "weights_setup":
                policy = big_mlp()
                weights = ShmSegment.attach(header["name"], header["nbytes"])
                sock.send(pack_message("ack"), timeout=DEADLINE)
            elif kind == "weights":
                assert policy is not None
                assert weights is not None
                unflatten_into(header["layout"], weights.tensor(), policy.state_dict())
                sock.send(pack_message("ack", {"version": header["version"]}), timeout=DEADLINE)
        if weights is not None:
            weights.close()


def wait_for_credit(sock: WorkerSocket) -> int:
    frames = sock.recv(timeout=DEADLINE)
    if frames is None:
        raise SystemExit("no credit from the collector")
    header, _ = unpack_message(frames, kinds={"credit"})
    return int(header["slot"])


# --------------------------------------------------------------------------- collector side


async def recv_kind(endpoint: Endpoint, kind: str) -> tuple[bytes, dict[str, Any], Any]:
    identity, frames = await endpoint.recv(timeout=DEADLINE)
    header, td = unpack_message(frames, kinds={kind})
    return identity, header, td


def copy_rate(nbytes: int, count: int) -> float:
    src, dst = payload(nbytes)["pixels"], torch.empty(nbytes, dtype=torch.uint8)
    dst.copy_(src)
    start = time.perf_counter()
    for _ in range(count):
        dst.copy_(src)
    return nbytes * count / (time.perf_counter() - start)


async def zmq_rate(endpoint: Endpoint, worker: bytes, nbytes: int, count: int) -> float:
    await endpoint.send(worker, pack_message("zmq_stream", {"nbytes": nbytes, "count": count + 1}))
    await endpoint.send(worker, pack_message("credit", {"slot": 0}))
    await recv_kind(endpoint, "batch")  # warm-up: the worker has built its payload
    start = time.perf_counter()
    for slot in range(CREDITS):
        await endpoint.send(worker, pack_message("credit", {"slot": slot}))
    for received in range(count):
        _, _, td = await recv_kind(endpoint, "batch")
        assert td["pixels"].numel() == nbytes
        if received + CREDITS < count:
            await endpoint.send(worker, pack_message("credit", {"slot": 0}))
    return nbytes * count / (time.perf_counter() - start)


async def shm_rate(endpoint: Endpoint, worker: bytes, nbytes: int, count: int, *, preallocated: bool) -> float:
    out = TensorDict({"pixels": torch.empty(nbytes, dtype=torch.uint8)}, batch_size=[])
    layout, _ = encode_tensordict(out)
    with ShmSlotRing.create(layout, CREDITS) as ring:
        header = {"nbytes": nbytes, "count": count + 1, "names": ring.names, "layout": ring.layout}
        await endpoint.send(worker, pack_message("shm_stream", header))
        await endpoint.send(worker, pack_message("credit", {"slot": 0}))
        _, ready, _ = await recv_kind(endpoint, "ready")
        ring[ready["slot"]].read()
        start = time.perf_counter()
        for slot in range(CREDITS):
            await endpoint.send(worker, pack_message("credit", {"slot": slot}))
        for received in range(count):
            _, ready, _ = await recv_kind(endpoint, "ready")
            # Copied out, so the slot can be written again: into the collector's own
            # (preallocated) batch buffer, or into fresh tensors.
            td = ring[ready["slot"]].read(out=out if preallocated else None)
            assert td["pixels"].numel() == nbytes
            if received + CREDITS < count:
                await endpoint.send(worker, pack_message("credit", {"slot": ready["slot"]}))
        return nbytes * count / (time.perf_counter() - start)


async def weight_push(endpoint: Endpoint, workers: list[bytes], rounds: int) -> dict[str, Any]:
    policy, replica = big_mlp(), big_mlp()
    sources, targets = list(policy.parameters()), list(replica.parameters())
    n_params = sum(p.numel() for p in sources)
    layout, flat = flatten_params(policy.state_dict())
    with ShmSegment.create(layout["nbytes"]) as segment:
        for worker in workers:
            await endpoint.send(worker, pack_message("weights_setup", {"name": segment.name, "nbytes": segment.size}))
        for _ in workers:
            await recv_kind(endpoint, "ack")
        copies, pushes = [], []
        for version in range(rounds + 1):  # the first round warms up
            start = time.perf_counter()
            with torch.no_grad():
                for target, source in zip(targets, sources, strict=True):
                    target.copy_(source)
            copy_s = time.perf_counter() - start
            start = time.perf_counter()
            layout, _ = flatten_params(policy.state_dict(), out=segment.tensor())
            for worker in workers:
                await endpoint.send(worker, pack_message("weights", {"layout": layout, "version": version}))
            for _ in workers:
                _, ack, _ = await recv_kind(endpoint, "ack")
                assert ack["version"] == version
            push_s = time.perf_counter() - start
            if version:
                copies.append(copy_s)
                pushes.append(push_s)
    del flat
    copy_ms, push_ms = statistics.median(copies) * 1e3, statistics.median(pushes) * 1e3
    return {"params": n_params, "copy_ms": copy_ms, "push_ms": push_ms, "ratio": push_ms / copy_ms}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    single_thread_torch()
    context = multiprocessing.get_context("spawn")
    async with Endpoint() as endpoint:
        processes = [
            context.Process(target=worker_main, args=(endpoint.address, f"w{i}".encode()), daemon=True)
            for i in range(2)
        ]
        for process in processes:
            process.start()
        workers = [(await recv_kind(endpoint, "hello"))[0] for _ in processes]
        results: dict[str, dict[str, list[float]]] = {}
        for round_index in range(args.rounds):
            for label, nbytes in SIZES.items():
                count = max(8, BYTES_PER_ROUND // nbytes)
                rates = {
                    "copy_": copy_rate(nbytes, count),
                    "zmq": await zmq_rate(endpoint, workers[0], nbytes, count),
                    "shm": await shm_rate(endpoint, workers[0], nbytes, count, preallocated=True),
                    "shm_alloc": await shm_rate(endpoint, workers[0], nbytes, count, preallocated=False),
                }
                for name, rate in rates.items():
                    results.setdefault(label, {}).setdefault(name, []).append(rate / 1e9)
                print(f"round {round_index + 1}/{args.rounds} {label:>8}: " + "  ".join(
                    f"{name} {rate / 1e9:5.2f} GB/s" for name, rate in rates.items()
                ))  # fmt: skip
        push = await weight_push(endpoint, workers, args.rounds)
        for worker in workers:
            await endpoint.send(worker, pack_message("stop"))
        for process in processes:
            await asyncio.to_thread(process.join, DEADLINE)
    return {"throughput_GBps": results, "weight_push": push}


def report(results: dict[str, Any]) -> None:
    names = ["copy_", "zmq", "shm", "shm_alloc"]
    print("\nmedian GB/s (ratio to copy_)")
    print(f"{'payload':>8} " + " ".join(f"{name:>16}" for name in names))
    for label, rates in results["throughput_GBps"].items():
        med = {name: statistics.median(values) for name, values in rates.items()}
        cells = [f"{med[name]:6.2f} ({med[name] / med['copy_']:4.2f}x)" for name in names]
        print(f"{label:>8} " + " ".join(f"{cell:>16}" for cell in cells))
    push = results["weight_push"]
    print(
        f"\nweight push, {push['params'] / 1e6:.1f}M params to 2 workers, acknowledged: {push['push_ms']:.1f} ms"
        f" vs one in-process copy {push['copy_ms']:.1f} ms ({push['ratio']:.1f}x; target <= 5x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender (medians are reported)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    report(figures)
    if arguments.json:
        write_json(arguments.json, {"args": vars(arguments), "machine": machine_info(), **figures})
