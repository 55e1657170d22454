"""Where the CPU goes against the ceiling: a worker's CPU a frame, the trainer's a batch, over long turns.

``ceiling.py`` compares frames/s over short turns. This script says where a collector's CPU goes, over turns
long enough that starting and stopping weigh nothing: ``MultiAsyncCollector`` with N workers x E CartPole envs
(the MLP of ``ceiling.py``, one worker's ``[E, T]`` a batch, 2 credits) against N independent hand-loop
processes of E envs (the ceiling), turns alternating. For each turn it reports:

* the workers' CPU a frame, against the hand loops' (the same env steps and the same policy: what the worker's
  own machinery adds);
* the trainer's CPU a batch: the whole process, and the event loop's thread alone (the rest is ZeroMQ's I/O
  thread and the like);
* frames/s of both, and their ratio.

    python benchmarks/ceiling_cpu.py --turns 3 --batches 200

On a machine with as many cores as workers, the trainer's CPU comes out of the workers' time: its share of the
cores is what a collector can lose against the ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, cpu_of, machine_info, make_policy, settle, write_json

from acollect import GymEnv, MultiAsyncCollector
from acollect.cli._reference_loops import LoopPool

CREDITS = 2  # MultiAsyncCollector's default


async def _collector_turn(collector: MultiAsyncCollector, pids: list[int], batches: int) -> dict[str, float]:
    process, thread, workers = time.process_time(), time.thread_time(), cpu_of(pids)
    wall, frames = time.perf_counter(), 0
    for _ in range(batches):
        frames += (await anext(collector)).numel()
    wall = time.perf_counter() - wall
    return {
        "frames_per_s": frames / wall,
        "worker_cpu_us_per_frame": (cpu_of(pids) - workers) / frames * 1e6,
        "trainer_cpu_ms_per_batch": (time.process_time() - process) / batches * 1e3,
        "trainer_loop_thread_ms_per_batch": (time.thread_time() - thread) / batches * 1e3,
    }


def _loops_turn(pool: LoopPool, batches: int) -> dict[str, float]:
    loops = pool.run(batches)
    return {
        "frames_per_s": loops.frames_per_s,
        "cpu_us_per_frame": sum(p.cpu_s for p in loops.processes) / loops.frames * 1e6,
    }


async def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    env = functools.partial(GymEnv, ENV_ID, num_envs=args.envs)
    per_worker = args.envs * args.steps
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    collector = MultiAsyncCollector(
        env, make_policy(), num_workers=args.workers, frames_per_batch=per_worker, total_frames=-1, credits=CREDITS
    )
    results: dict[str, list[dict[str, float]]] = {"collector": [], "loops": []}
    async with collector:
        for _ in range(4 * args.workers):
            await anext(collector)  # every worker started and warm
        pids = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
        pool = await asyncio.to_thread(LoopPool, args.workers, args.envs, per_worker, seed=0, warmup=2, timeout=600)
        try:
            # The loop processes take as many batches of their E envs as the collector's turn takes from each worker.
            loop_batches = max(1, args.batches // args.workers)
            for turn in range(args.turns):
                order = ["collector", "loops"] if turn % 2 == 0 else ["loops", "collector"]
                for name in order:
                    await settle(pids, interval=0.2)
                    if name == "collector":
                        for _ in range(args.workers * CREDITS):
                            await anext(collector)  # what the workers collected ahead meanwhile: untimed
                        result = await _collector_turn(collector, pids, args.batches)
                    else:
                        result = await asyncio.to_thread(_loops_turn, pool, loop_batches)
                    results[name].append(result)
                collected, loops = results["collector"][-1], results["loops"][-1]
                print(
                    f"turn {turn + 1}/{args.turns}: collector {collected['frames_per_s']:,.0f} frames/s, workers "
                    f"{collected['worker_cpu_us_per_frame']:.2f} us CPU a frame, trainer "
                    f"{collected['trainer_cpu_ms_per_batch']:.2f} ms a batch "
                    f"({collected['trainer_loop_thread_ms_per_batch']:.2f} on the event loop's thread); hand loops "
                    f"{loops['frames_per_s']:,.0f} frames/s, {loops['cpu_us_per_frame']:.2f} us CPU a frame; "
                    f"ratio {collected['frames_per_s'] / loops['frames_per_s']:.2f}x",
                    flush=True,
                )
        finally:
            pool.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes, and hand-loop processes")
    parser.add_argument("--envs", type=int, default=16, help="CartPole envs per worker (and per loop process)")
    parser.add_argument("--steps", type=int, default=64, help="time steps of one worker's batch")
    parser.add_argument("--batches", type=int, default=200, help="timed batches of the collector per turn")
    parser.add_argument("--turns", type=int, default=3, help="turns of each (alternating)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    results = asyncio.run(measure(args))
    collected, loops = results["collector"], results["loops"]
    ratios = [c["frames_per_s"] / lo["frames_per_s"] for c, lo in zip(collected, loops, strict=True)]
    print(
        f"\nmedians: workers {statistics.median(c['worker_cpu_us_per_frame'] for c in collected):.2f} us CPU a frame "
        f"against the hand loops' {statistics.median(lo['cpu_us_per_frame'] for lo in loops):.2f}; trainer "
        f"{statistics.median(c['trainer_cpu_ms_per_batch'] for c in collected):.2f} ms a batch; MultiAsync / hand "
        f"loops {statistics.median(ratios):.2f}x frames/s (turns: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    if args.json is not None:
        write_json(args.json, {"machine": machine_info(), "args": vars(args), "results": results, "ratios": ratios})


if __name__ == "__main__":
    main()
