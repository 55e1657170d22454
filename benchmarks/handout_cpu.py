"""The trainer's CPU per batch handed out: what a small batch costs the process that consumes it.

Two workers of ``CountingEnv`` (4 envs each, a step costs next to nothing) and 64-frame batches: the workers are
never the limit, and what is measured is the trainer's own work per batch (receiving and checking the message,
building the TensorDict, the bookkeeping, giving the credit back). ``time.process_time()`` over ``--batches``
batches, after a warm-up, for ``MultiAsyncCollector`` and ``MultiSyncCollector`` (whose batch is two parts).

    python benchmarks/handout_cpu.py --batches 1500 --runs 3
    python benchmarks/handout_cpu.py --workers 128 --step-ms 20 --kinds MultiAsyncCollector --batches 600 --runs 1

With many workers on few cores, ``--step-ms`` makes every env step sleep (``SlowEnv``): the workers then leave the
cores to the trainer, whose CPU per batch is what fans in from them all.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time

from acollect import MultiAsyncCollector, MultiSyncCollector
from acollect.testing import CountingEnv, SlowEnv


async def measure(kind: type, workers: int, batches: int, step_ms: float = 0.0) -> float:
    """Milliseconds of this process's CPU per batch handed out."""
    env = (
        functools.partial(SlowEnv, step_ms / 1000, num_envs=4)
        if step_ms
        else functools.partial(CountingEnv, num_envs=4)
    )
    envs = [env] * workers
    async with kind(envs, None, frames_per_batch=64, total_frames=-1) as collector:
        for _ in range(50):  # warm: workers started, memory reused
            await anext(collector)
        cpu = time.process_time()
        for _ in range(batches):
            await anext(collector)
        return 1000 * (time.process_time() - cpu) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=0.0, help="each env step sleeps this long (SlowEnv)")
    parser.add_argument("--kinds", default="MultiAsyncCollector,MultiSyncCollector")
    args = parser.parse_args()
    kinds = [k for k in (MultiAsyncCollector, MultiSyncCollector) if k.__name__ in args.kinds.split(",")]
    results: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for kind in kinds:  # alternating, run after run
            cpu = asyncio.run(measure(kind, args.workers, args.batches, args.step_ms))
            results.setdefault(kind.__name__, []).append(cpu)
    for name, values in results.items():
        print(f"{name:20s} {args.workers} workers: {statistics.median(values):.3f} ms CPU per 64-frame batch (runs: "
              + ", ".join(f"{v:.3f}" for v in values) + ")")  # fmt: skip


if __name__ == "__main__":
    main()
