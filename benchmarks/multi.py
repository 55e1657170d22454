"""Worker-process collection: pixel batches, weight pushes, start-up and shutdown.

Four measurements, each against an in-process reference taken in the same run (CartPole
throughput against the ceiling of independent processes is ``ceiling.py``):

1. ``pixels``: a synthetic env of 84x84x4 uint8 observations with no step cost
   (:class:`acollect.testing.PixelEnv`), 2 workers x 8 envs: batch bytes delivered per second,
   against ``tensor.copy_`` of a batch of that size into a preallocated tensor, timed in every
   round; MultiSync and MultiAsync, each with the default (the workers' shared memory lent, given
   back once the caller drops the batch) and with ``copy_batches=True`` (every batch copied). Every
   worker batch is ``[8, --pixel-steps]``. The four collectors are started and warmed up once,
   then they and the ``copy_`` take turns of ``--pixel-batches`` batches (the order rotating);
   a MultiAsyncCollector's batches collected ahead during the others' turns are taken untimed.
2. ``weights``: a 10M-parameter MLP pushed to 2 idle workers and acknowledged, against one
   in-process copy of its parameters.
3. ``startup``: constructing a 2-worker collector (``start_method="spawn"``) to its first batch, against
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
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
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
PIXEL_CONTENDERS = {"sync": (True, False), "sync_copied": (True, True), "async": (False, False),
                    "async_copied": (False, True)}  # fmt: skip  # name: (MultiSync?, copy_batches)


def _nbytes(batch: TensorDict) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values(True, True))


async def _pixel_turns(args: argparse.Namespace) -> tuple[dict[str, list[tuple[int, float]]], int]:
    envs, steps, k = 8, args.pixel_steps, args.pixel_batches
    turns: dict[str, list[tuple[int, float]]] = {name: [] for name in (*PIXEL_CONTENDERS, "copy_")}
    async with AsyncExitStack() as stack:
        collectors: dict[str, Any] = {}
        for name, (sync, copy) in PIXEL_CONTENDERS.items():
            cls: Any = MultiSyncCollector if sync else MultiAsyncCollector
            fpb = (2 if sync else 1) * envs * steps  # every worker batch is [envs, steps]
            collector = cls([functools.partial(PixelEnv, envs)] * 2, frames_per_batch=fpb, total_frames=-1,
                            copy_batches=copy)  # fmt: skip
            collectors[name] = await stack.enter_async_context(collector)
            for _ in range(1 if sync else 2):  # every worker's first batch pays for its start-up: untimed
                first = await anext(collector)
            batch_bytes = _nbytes(first) * (1 if sync else 2)  # the bytes of one MultiSync batch
        src = torch.randint(0, 255, (batch_bytes,), dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)  # faulted in once: the reference copies into memory that is already there

        async def copy_turn() -> tuple[int, float]:
            start = time.perf_counter()
            for _ in range(k):
                dst.copy_(src)
            return k * batch_bytes, time.perf_counter() - start

        def collector_turn(name: str) -> Callable[[], Awaitable[tuple[int, float]]]:
            sync = PIXEL_CONTENDERS[name][0]

            async def run() -> tuple[int, float]:
                collector = collectors[name]
                if not sync:  # what its workers collected ahead during the others' turns: untimed
                    for _ in range(2 * 2):
                        await anext(collector)
                start, nbytes = time.perf_counter(), 0
                for _ in range(k if sync else 2 * k):
                    nbytes += _nbytes(await anext(collector))
                return nbytes, time.perf_counter() - start

            return run

        runs = [(name, collector_turn(name)) for name in PIXEL_CONTENDERS] + [("copy_", copy_turn)]
        for index in range(args.pixel_turns):
            shift = index % len(runs)  # the order rotates: no contender always follows the same one
            for name, run in runs[shift:] + runs[:shift]:
                turns[name].append(await run())
            last = ", ".join(f"{name} {t[-1][0] / t[-1][1] / 1e9:.2f}" for name, t in turns.items())
            print(f"  turn {index + 1}: {last} GB/s", flush=True)
    return turns, batch_bytes


def pixels(args: argparse.Namespace) -> dict[str, Any]:
    # All five contenders live at once and take turns, the order rotating, so load changes hit all alike.
    turns, batch_bytes = asyncio.run(_pixel_turns(args))
    rates = {name: sum(b for b, _ in t) / sum(s for _, s in t) for name, t in turns.items()}
    ratios = {name: rates[name] / rates["copy_"] for name in PIXEL_CONTENDERS}
    figures = ", ".join(f"{name} {rates[name] / 1e9:.2f} GB/s ({ratios[name]:.2f}x)" for name in PIXEL_CONTENDERS)
    print(f"pixels ({batch_bytes / 1e6:.0f} MB per MultiSync batch; copy_ {rates['copy_'] / 1e9:.2f} GB/s): {figures}")
    return {"turns": {name: [{"bytes": b, "seconds": s} for b, s in t] for name, t in turns.items()},
            "bytes_per_s": rates, "batch_bytes": batch_bytes, "ratio_to_copy": ratios, "goal": 0.9,
            "copied_goal": 0.6}  # fmt: skip


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
    parser.add_argument("--pixel-batches", type=int, default=10, help="timed MultiSync batches (or copies) per turn")
    parser.add_argument("--pixel-steps", type=int, default=32, help="T of each pixel batch (8 envs per worker)")
    parser.add_argument("--pixel-turns", type=int, default=8, help="turns of each pixel contender")
    parser.add_argument("--weight-reps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    single_thread_torch()
    machine = machine_info()  # the load average as the runs start
    results = {name: PARTS[name](args) for name in args.only}
    payload = {"benchmark": "multi", "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine,
               "results": results}  # fmt: skip
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
