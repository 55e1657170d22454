"""Worker-process collection: pixel batches, weight pushes, start-up and shutdown.

Four measurements, each against an in-process reference taken in the same run (CartPole
throughput against the ceiling of independent processes is ``ceiling.py``):

1. ``pixels``: a synthetic env of 84x84x4 uint8 observations with no step cost
   (:class:`acollect.testing.PixelEnv`), 2 workers x 8 envs: batch bytes delivered per second,
   against ``tensor.copy_`` of a batch of that size into a preallocated tensor, timed in every
   round; MultiSync and MultiAsync, each with the default ``copy_batches=True`` (every batch
   memory of its own) and with ``copy_batches=False`` (lent until the next iteration). Every
   worker batch is ``[8, --pixel-steps]``; rounds alternate between the contenders.
2. ``weights``: a 10M-parameter MLP pushed to 2 idle workers and acknowledged, against one
   in-process copy of its parameters.
3. ``startup``: constructing a 2-worker collector (default ``spawn``) to its first batch, against
   a fresh ``python -c "import torch, gymnasium, acollect"``.
4. ``shutdown``: ``async_shutdown()`` of a 4-worker collector in mid-collection.

Run ``python benchmarks/multi.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import CategoricalMLPPolicy, machine_info, single_thread_torch, write_json

from acollect import GymEnv, MultiAsyncCollector, MultiSyncCollector
from acollect.testing import CountingEnv, PixelEnv


class BigPolicy(torch.nn.Module):
    """Acts 0 on any observation; carries a ~10M-parameter MLP to push around."""

    def __init__(self) -> None:
        super().__init__()
        self.big = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1400))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[0], dtype=torch.int64)


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


# -- 1. pixels ------------------------------------------------------------------------------------
async def _pixel_round(batches: int, envs: int, steps: int, kind: str, copy: bool = True) -> tuple[float, int]:
    if kind == "sync":  # one batch from both workers per request: [2, envs, steps]
        fpb = 2 * envs * steps
        collector: Any = MultiSyncCollector(
            [functools.partial(PixelEnv, envs)] * 2,
            frames_per_batch=fpb,
            total_frames=(batches + 1) * fpb,
            copy_batches=copy,
        )
    else:  # each worker collects ahead (2 credits); batches of [envs, steps], twice as many of them
        fpb, batches = envs * steps, 2 * batches
        collector = MultiAsyncCollector(
            [functools.partial(PixelEnv, envs)] * 2,
            frames_per_batch=fpb,
            total_frames=(batches + 1) * fpb,
            copy_batches=copy,
        )
    warmup = 1 if kind == "sync" else 2  # every worker's first batch pays for its start-up: untimed
    async with collector:
        nbytes, first, seen = 0, 0.0, 0
        async for batch in collector:
            seen += 1
            if seen <= warmup:
                first = time.perf_counter()
                continue
            nbytes += sum(t.numel() * t.element_size() for t in batch.values(True, True))
        return nbytes / (time.perf_counter() - first), nbytes // (batches + 1 - warmup)


def _copy_rate(nbytes: int) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps, start = 20, time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return reps * nbytes / (time.perf_counter() - start)


def pixels(args: argparse.Namespace) -> dict[str, Any]:
    # Rounds alternate between the contenders, and copy_ is timed in each round, so load changes hit all alike.
    contenders = {"sync": ("sync", True), "sync_lent": ("sync", False), "async": ("async", True),
                  "async_lent": ("async", False)}  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    copies: list[float] = []
    batch_bytes = 0
    for r in range(args.pixel_rounds):
        for name, (kind, copy) in contenders.items():
            rate, nbytes = asyncio.run(_pixel_round(args.pixel_batches, 8, args.pixel_steps, kind, copy))
            rates[name].append(rate)
            batch_bytes = batch_bytes or (nbytes if kind == "sync" else 2 * nbytes)
        copies.append(_copy_rate(batch_bytes))
        print(f"  round {r + 1}: " + ", ".join(f"{n} {v[-1] / 1e9:.2f}" for n, v in rates.items())
              + f", copy_ {copies[-1] / 1e9:.2f} GB/s")  # fmt: skip
    copy_rate = _median(copies)
    ratios = {name: _median(v) / copy_rate for name, v in rates.items()}
    figures = ", ".join(f"{name} {_median(rates[name]) / 1e9:.2f} GB/s ({ratios[name]:.2f}x)" for name in rates)
    print(f"pixels ({batch_bytes / 1e6:.0f} MB per MultiSync batch; copy_ {copy_rate / 1e9:.2f} GB/s): {figures}")
    return {"sync_bytes_per_s": rates["sync"], "sync_lent_bytes_per_s": rates["sync_lent"],
            "async_bytes_per_s": rates["async"], "async_lent_bytes_per_s": rates["async_lent"],
            "copy_bytes_per_s": copies, "batch_bytes": batch_bytes, "ratio": ratios["sync"],
            "lent_ratio": ratios["sync_lent"], "async_ratio": ratios["async"],
            "async_lent_ratio": ratios["async_lent"], "goal": 0.6, "lent_goal": 0.9}  # fmt: skip


# -- 2. weights -----------------------------------------------------------------------------------
async def _weights(reps: int) -> tuple[list[float], int]:
    policy = BigPolicy()
    n_params = sum(p.numel() for p in policy.parameters())
    async with MultiSyncCollector([CountingEnv] * 2, BigPolicy(), frames_per_batch=2, total_frames=-1) as collector:
        await anext(collector)
        await collector.update_policy_weights_(policy)  # first push creates the segment
        times = []
        for _ in range(reps):
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(1.0)
            start = time.perf_counter()
            await collector.update_policy_weights_(policy)
            times.append(time.perf_counter() - start)
    return times, n_params


def weights(args: argparse.Namespace) -> dict[str, Any]:
    times, n_params = asyncio.run(_weights(args.weight_reps))
    src, dst = TensorDict.from_module(BigPolicy()), TensorDict.from_module(BigPolicy())
    copies = []
    for _ in range(args.weight_reps):
        start = time.perf_counter()
        with torch.no_grad():
            dst.update_(src)
        copies.append(time.perf_counter() - start)
    ratio = _median(times) / _median(copies)
    print(f"weights: {n_params / 1e6:.1f}M params, push to 2 workers {_median(times) * 1e3:.1f} ms, in-process copy "
          f"{_median(copies) * 1e3:.1f} ms -> {ratio:.1f}x")  # fmt: skip
    return {"params": n_params, "push_s": times, "copy_s": copies, "ratio": ratio, "target": 5.0}


# -- 3. start-up ----------------------------------------------------------------------------------
async def _startup(start_method: str) -> float:
    start = time.perf_counter()
    async with MultiSyncCollector(
        functools.partial(GymEnv, "CartPole-v1", num_envs=16),
        CategoricalMLPPolicy(),
        num_workers=2,
        frames_per_batch=2048,
        start_method=start_method,
    ) as collector:
        await anext(collector)
        return time.perf_counter() - start


def startup(args: argparse.Namespace) -> dict[str, Any]:
    imports, collector = [], []
    root = str(Path(__file__).resolve().parent.parent)
    for _ in range(args.rounds):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, gymnasium, acollect"], check=True, cwd=root)
        imports.append(time.perf_counter() - start)
        collector.append(asyncio.run(_startup("spawn")))
    ratio = _median(collector) / _median(imports)
    print(f"startup: 2-worker collector to first batch {_median(collector):.2f} s, python -c 'import torch, "
          f"gymnasium, acollect' {_median(imports):.2f} s -> {ratio:.2f}x")  # fmt: skip
    return {"collector_s": collector, "import_s": imports, "ratio": ratio, "target": 2.0}


# -- 4. shutdown ----------------------------------------------------------------------------------
async def _shutdown() -> float:
    collector = MultiAsyncCollector(
        functools.partial(GymEnv, "CartPole-v1", num_envs=8), CategoricalMLPPolicy(), num_workers=4,
        frames_per_batch=100_000,
    )  # fmt: skip
    await collector.__aenter__()
    await asyncio.sleep(0.5)  # every worker is mid-batch
    start = time.perf_counter()
    await collector.async_shutdown()
    return time.perf_counter() - start


def shutdown(args: argparse.Namespace) -> dict[str, Any]:
    times = [asyncio.run(_shutdown()) for _ in range(args.rounds)]
    print(f"shutdown: 4 workers mid-collection {_median(times):.3f} s")
    return {"shutdown_s": times}


PARTS = {"pixels": pixels, "weights": weights, "startup": startup, "shutdown": shutdown}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--only", nargs="*", choices=sorted(PARTS), default=list(PARTS), help="parts to run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds for startup and shutdown")
    parser.add_argument("--pixel-batches", type=int, default=40, help="timed MultiSync batches per round")
    parser.add_argument("--pixel-steps", type=int, default=32, help="T of each pixel batch (8 envs per worker)")
    parser.add_argument("--pixel-rounds", type=int, default=3, help="rounds of the pixel contenders")
    parser.add_argument("--weight-reps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    single_thread_torch()
    results = {name: PARTS[name](args) for name in args.only}
    payload = {"benchmark": "multi", "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_info(),
               "results": results}  # fmt: skip
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
