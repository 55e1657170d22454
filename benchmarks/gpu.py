"""The GPU host's figures in one run (under five minutes): hand-out, the server's pass, central inference, a real game.

Run on a machine with a CUDA device and many cores (written for 16 cores and one H100 or H200), from the repository
root, with the project's environment (``pip install -e '.[dev]'``: torch, tensordict, pyzmq, gymnasium, ale-py)::

    python benchmarks/gpu.py                       # every part; docs/data/gpu-<part>.json
    python benchmarks/gpu.py --only handout pass   # some parts
    python benchmarks/gpu.py --quick               # a smoke run of the script itself (CPU parts only without CUDA)

Parts (each a few tens of seconds; contenders alternate, as everywhere in benchmarks/):

* ``handout``: ``MultiAsyncCollector``, ``--workers`` x 16 :class:`~acollect.testing.PixelEnv` (84x84x4 uint8, no
  step cost), random actions in the workers, batches of one worker's ``[16, 16]``: lent (the default), copied
  (``copy_batches=True``), and written to the GPU (``storing_device="cuda"``: by default ``.to`` on the caller's
  stream; with ``cuda_dma=True`` by DMA from registered memory) against the CPU hand-out followed by the caller's own
  ``.to("cuda")``;
* ``pass``: the Nature CNN's pass measured bare in this process (B=128 and 224: pageable copy + forward + actions
  back; the same from page-locked memory; the forward alone; the forward as a CUDA graph), against the inference
  server's own ``forward_ms_mean`` over the same workload (``AsyncBatchedCollector``, the CNN on cuda);
* ``central``: ``benchmarks/central_inference.py --workload cnn --device cuda`` (``--workers`` x 16);
* ``pong``: ``benchmarks/central_inference.py --workload atari --device cuda`` (``--workers`` x 8 Pong): env only,
  the CNN on the workers' CPUs, the CNN on the GPU;
* ``ceiling``: ``benchmarks/ceiling.py --workers 8 --envs 8``.

Each part writes ``docs/data/gpu-<part>.json`` (``--out`` elsewhere) with the machine it ran on; ``docs/performance.md``
has the GPU table these fill.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import torch
from _common import machine_info, single_thread_torch, write_json
from central_inference import Frames, nature_cnn

from acollect import AsyncBatchedCollector, MultiAsyncCollector
from acollect.testing import PixelEnv

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("handout", "pass", "central", "pong", "ceiling")
PONG_ACTIONS = 6


def cuda() -> bool:
    return torch.cuda.is_available()


# -- handout ------------------------------------------------------------------------------------------------------
def pixels(num_envs: int) -> PixelEnv:
    return PixelEnv(num_envs=num_envs)


async def _rate(collector: MultiAsyncCollector, seconds: float, to_cuda: bool = False) -> float:
    async with collector:
        for _ in range(2 * collector.num_workers):
            await anext(collector)
        frames, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            batch = await anext(collector)
            if to_cuda:
                batch = batch.to("cuda", non_blocking=True)
            frames += batch.numel()
        if cuda():
            torch.cuda.synchronize()
        return frames / (time.perf_counter() - started)


async def handout(args: argparse.Namespace) -> dict[str, Any]:
    env = functools.partial(pixels, 16)
    common = {"num_workers": args.workers, "frames_per_batch": 256, "start_method": "forkserver"}
    contenders: dict[str, Callable[[], Any]] = {
        "lent (the default)": lambda: _rate(MultiAsyncCollector(env, None, **common), args.seconds),
        "copied (copy_batches=True)": lambda: _rate(
            MultiAsyncCollector(env, None, copy_batches=True, **common), args.seconds
        ),
    }
    if cuda():
        contenders["storing_device='cuda' (the default: .to on the caller's stream)"] = lambda: _rate(
            MultiAsyncCollector(env, None, storing_device="cuda", **common), args.seconds
        )
        contenders["storing_device='cuda', cuda_dma=True (registered, DMA)"] = lambda: _rate(
            MultiAsyncCollector(env, None, storing_device="cuda", cuda_dma=True, **common), args.seconds
        )
        contenders["lent, then the caller's .to('cuda')"] = lambda: _rate(
            MultiAsyncCollector(env, None, **common), args.seconds, to_cuda=True
        )
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for turn in range(args.turns):
        order = list(contenders)[turn % len(contenders) :] + list(contenders)[: turn % len(contenders)]
        for name in order:
            rates[name].append(await contenders[name]())
        print(f"handout turn {turn + 1}: " + ", ".join(f"{n} {r[-1]:,.0f}" for n, r in rates.items()), flush=True)
    medians = {name: statistics.median(r) for name, r in rates.items()}
    return {"frames_per_s": medians, "turns": rates}


# -- pass ----------------------------------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def bare_pass(batch: int, reps: int) -> dict[str, float]:
    device = torch.device("cuda")
    net = nature_cnn(Frames(), PONG_ACTIONS).to(device).eval()
    host = torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8)
    pinned = host.pin_memory()
    on_device = host.to(device)
    actions_out = torch.empty(batch, dtype=torch.int64, pin_memory=True)
    static_in = on_device.clone()
    figures: dict[str, float] = {}
    with torch.inference_mode():
        figures["pageable copy + forward + actions back"] = _timed(lambda: net(host.to(device)).argmax(-1).cpu(), reps)

        def pinned_pass() -> None:
            actions_out.copy_(net(pinned.to(device, non_blocking=True)).argmax(-1), non_blocking=True)

        figures["page-locked copy + forward + actions back"] = _timed(pinned_pass, reps)
        figures["forward alone"] = _timed(lambda: net(on_device), reps)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            net(static_in)  # warm-up before capture, on a side stream as capture requires
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad(), torch.cuda.graph(graph):
        net(static_in)
    figures["forward as a CUDA graph"] = _timed(graph.replay, reps)
    return figures


def cnn_policy() -> Any:
    from central_inference import Categorical, PixelsIn
    from tensordict.nn import TensorDictModule

    return TensorDictModule(Categorical(nature_cnn(PixelsIn(), 2)), in_keys=["pixels"], out_keys=["action"])


async def server_pass(args: argparse.Namespace) -> dict[str, Any]:
    env = functools.partial(pixels, 16)
    collector = AsyncBatchedCollector(env, cnn_policy(), num_workers=args.workers, frames_per_batch=256,
                                      device="cuda", start_method="forkserver")  # fmt: skip
    async with collector:
        for _ in range(2 * args.workers):
            await anext(collector)
        frames, started = 0, time.perf_counter()
        while time.perf_counter() - started < args.seconds * 2:
            frames += (await anext(collector)).numel()
        rate = frames / (time.perf_counter() - started)
        inference = collector.stats().inference
    return {"frames_per_s": rate, "server": inference}


async def the_pass(args: argparse.Namespace) -> dict[str, Any]:
    if not cuda():
        return {"skipped": "no CUDA device"}
    reps = 50 if args.quick else 300
    bare = {str(b): bare_pass(b, reps) for b in (128, 224)}
    server = await server_pass(args)
    mean_batch = server["server"]["mean_batch_size"] if server["server"] else 0.0
    nearest = "224" if mean_batch > 176 else "128"
    ratio = server["server"]["forward_ms_mean"] / bare[nearest]["page-locked copy + forward + actions back"]
    print(f"pass: bare {bare}; server mean batch {mean_batch:.0f}, forward_ms_mean "
          f"{server['server']['forward_ms_mean']:.2f} ms ({ratio:.2f}x the bare page-locked pass of B={nearest}); "
          f"{server['frames_per_s']:,.0f} frames/s", flush=True)  # fmt: skip
    return {"bare_ms": bare, "server": server, "server_pass_over_bare_pinned": ratio, "goal": 1.5}


# -- the parts that are benchmarks of their own ----------------------------------------------------------------------
def run_script(args: argparse.Namespace, script: str, extra: list[str], part: str) -> dict[str, Any]:
    out = args.out / f"gpu-{part}-raw.json"
    command = [sys.executable, str(ROOT / "benchmarks" / script), *extra, "--json", str(out)]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, timeout=args.part_timeout, check=False)
    if done.returncode != 0:
        return {"failed": done.returncode, "command": command}
    result = json.loads(out.read_text())
    out.unlink()
    return {"command": command, "result": result}


def central(args: argparse.Namespace) -> dict[str, Any]:
    if not cuda():
        return {"skipped": "no CUDA device"}
    return run_script(args, "central_inference.py", [
        "--workload", "cnn", "--device", "cuda", "--workers", str(args.workers), "--envs", "16", "--servers",
        "process", "--turns", "2" if args.quick else "4",
    ], "central")  # fmt: skip


def pong(args: argparse.Namespace) -> dict[str, Any]:
    if not cuda():
        return {"skipped": "no CUDA device"}
    return run_script(args, "central_inference.py", [
        "--workload", "atari", "--device", "cuda", "--workers", str(args.workers), "--envs", "8", "--servers",
        "process", "--turns", "2" if args.quick else "4", "--turn-batches", "8",
    ], "pong")  # fmt: skip


def ceiling(args: argparse.Namespace) -> dict[str, Any]:
    return run_script(args, "ceiling.py", ["--workers", "8", "--envs", "8", "--turns", "2" if args.quick else "6"],
                      "ceiling")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=PARTS, default=list(PARTS))
    parser.add_argument("--workers", type=int, default=14, help="worker processes (the cores but two)")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per hand-out turn")
    parser.add_argument("--turns", type=int, default=2, help="turns of each hand-out contender")
    parser.add_argument("--part-timeout", type=float, default=150.0, help="seconds a benchmark part may take")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "data")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few turns, short parts")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.turns = 1.0, 1
        args.workers = min(args.workers, 2)
    single_thread_torch()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    machine["cuda"] = torch.cuda.get_device_name() if cuda() else None
    runners: dict[str, Callable[[], Any]] = {
        "handout": lambda: asyncio.run(handout(args)),
        "pass": lambda: asyncio.run(the_pass(args)),
        "central": lambda: central(args),
        "pong": lambda: pong(args),
        "ceiling": lambda: ceiling(args),
    }
    started = time.perf_counter()
    for part in args.only:
        began = time.perf_counter()
        result = runners[part]()
        payload = {"benchmark": f"gpu-{part}", "args": {**vars(args), "out": str(args.out)}, "machine": machine,
                   "result": result, "seconds": time.perf_counter() - began}  # fmt: skip
        write_json(args.out / f"gpu-{part}.json", payload)
        print(f"== {part}: {time.perf_counter() - began:.0f} s", flush=True)
    print(f"== all: {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
