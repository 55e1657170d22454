"""Worker-process collectors against their ceiling: N independent hand-loop processes started together.

The ceiling is what N processes make when nothing connects them: each runs the loop a user
writes instead (:class:`~acollect.cli.reference_loops.CleanRLLoop`: ``gym.make_vec`` sync with
the default autoreset, the MLP in a ``TensorDictModule``, ``[E, T]`` buffers cloned per batch)
with E envs, and the ceiling is the sum of their frames/s. Every process imports, builds its
loop and collects a warm-up batch before all of them meet at a barrier; then each times the
same number of batches. A collector cannot beat it: it does the same work plus moving every
batch to the trainer process, which on a small machine competes with the workers for the cores.

In each round, in turns (fresh processes every time, start-up and warm-up never timed):

* ``ceiling``: N independent loop processes of E envs;
* ``MultiAsyncCollector``: N workers x E envs, each worker batch ``[E, T]`` as in the ceiling;
* ``MultiSyncCollector``: N workers x E envs, ``frames_per_batch`` frames per batch from all;
* ``one hand loop``: a single loop process of E envs (what one core does alone).

All contenders collect the same total of frames per round. The figures are median frames/s over
the rounds, and ratios of medians (the JSON also has the ratio within each round).

    python benchmarks/ceiling.py --json docs/data/ceiling.json                           # 2 x 16
    python benchmarks/ceiling.py --workers 8 --envs 8 --json docs/data/ceiling-8x8.json  # 16 cores

Run ``python benchmarks/ceiling.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (
    ENV_ID,
    machine_info,
    make_policy,
    median,
    run_independent_loops,
    single_thread_torch,
    write_json,
)

from acollect import GymEnv, MultiAsyncCollector, MultiSyncCollector

CEILING, ASYNC, SYNC, SINGLE = "ceiling", "MultiAsyncCollector", "MultiSyncCollector", "one hand loop"
# (contender, reference, goal) for each ratio the table reports.
GOALS = [(ASYNC, CEILING, 0.9), (SYNC, CEILING, 0.85), (SYNC, SINGLE, 1.7)]


def worker_frames(args: argparse.Namespace) -> int:
    """Frames of one worker's batch, ``[E, T]``, the same in every contender."""
    return args.frames_per_batch // args.workers


async def _collector_round(args: argparse.Namespace, sync: bool) -> dict[str, float]:
    per_worker = worker_frames(args)
    options: dict[str, Any] = {"num_workers": args.workers, "total_frames": -1}
    if sync:  # one batch from all workers per request
        cls: Any = MultiSyncCollector
        options["frames_per_batch"], warmup = args.frames_per_batch, args.warmup
    else:  # one worker's batch at a time; every worker's first batches are warm-up
        cls = MultiAsyncCollector
        options["frames_per_batch"], warmup = per_worker, args.warmup * args.workers
    created = time.perf_counter()
    async with cls(functools.partial(GymEnv, ENV_ID, num_envs=args.envs), make_policy(), **options) as collector:
        for _ in range(warmup):
            await anext(collector)
        first = time.perf_counter()
        frames = 0
        while frames < args.frames:
            frames += (await anext(collector)).numel()
        seconds = time.perf_counter() - first
    return {"frames": frames, "seconds": seconds, "frames_per_s": frames / seconds, "startup_s": first - created}


def _loops_round(args: argparse.Namespace, n_processes: int, seed: int) -> dict[str, Any]:
    per_worker = worker_frames(args)
    batches = max(1, args.frames // (per_worker * args.workers))
    created = time.perf_counter()
    loops = run_independent_loops(
        n_processes, args.envs, per_worker, batches, warmup=args.warmup, seed=seed, timeout=args.timeout
    )
    total = time.perf_counter() - created
    return {"frames": loops.frames, **loops.as_dict(), "total_s": total}


def run_rounds(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    rounds: dict[str, list[dict[str, Any]]] = {CEILING: [], ASYNC: [], SYNC: [], SINGLE: []}
    for r in range(args.rounds):
        rounds[CEILING].append(_loops_round(args, args.workers, seed=100 * r))
        rounds[ASYNC].append(asyncio.run(_collector_round(args, sync=False)))
        rounds[SYNC].append(asyncio.run(_collector_round(args, sync=True)))
        rounds[SINGLE].append(_loops_round(args, 1, seed=100 * r + 50))
        line = ", ".join(f"{name} {results[-1]['frames_per_s']:,.0f}" for name, results in rounds.items())
        print(f"round {r + 1}/{args.rounds}: {line} frames/s", flush=True)
    return rounds


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {name: median([x["frames_per_s"] for x in results]) for name, results in rounds.items()}
    ratios = []
    for contender, reference, goal in GOALS:
        pairs = zip(rounds[contender], rounds[reference], strict=True)
        per_round = [c["frames_per_s"] / r["frames_per_s"] for c, r in pairs]
        ratios.append({"contender": contender, "reference": reference, "ratio": medians[contender] / medians[reference],
                       "per_round": per_round, "goal": goal})  # fmt: skip
    return {"median_frames_per_s": medians, "ratios": ratios}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=2, help="worker processes, and independent loop processes")
    parser.add_argument("--envs", type=int, default=16, help="CartPole envs per worker (and per loop process)")
    parser.add_argument("--frames-per-batch", type=int, default=2048, help="MultiSync frames per batch, all workers")
    parser.add_argument("--frames", type=int, default=102_400, help="timed frames per contender and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per worker / process first")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one ceiling run may take")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    for name in ("workers", "envs", "frames_per_batch", "frames", "rounds"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.frames_per_batch % (args.workers * args.envs):
        parser.error(f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --workers x --envs "
                     f"({args.workers * args.envs})")  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    single_thread_torch()
    machine = machine_info()
    t = worker_frames(args) // args.envs
    print(f"{ENV_ID}, {args.workers} workers x {args.envs} envs, worker batches [{args.envs}, {t}], {args.frames:,} "
          f"timed frames per contender x {args.rounds} rounds, {machine['cpu_count']} cores")  # fmt: skip
    rounds = run_rounds(args)
    summary = summarize(rounds)
    print()
    for name, value in summary["median_frames_per_s"].items():
        print(f"{name:<24}{value:>12,.0f} frames/s (median)")
    for ratio in summary["ratios"]:
        verdict = "meets" if ratio["ratio"] >= ratio["goal"] else "misses"
        print(f"{ratio['contender']} / {ratio['reference']} = {ratio['ratio']:.2f}x "
              f"({verdict} the goal of {ratio['goal']}x)")  # fmt: skip
    payload = {
        "benchmark": "ceiling",
        "env": ENV_ID,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine,
        "rounds": rounds,
        **summary,
    }
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
