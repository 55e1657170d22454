"""Worker-process collectors against their ceiling: N independent hand-loop processes started together.

The ceiling is what N processes make when nothing connects them: each runs the loop a user
writes instead (:class:`~acollect.cli._reference_loops.CleanRLLoop`: ``gym.make_vec`` sync with
the default autoreset, the MLP in a ``TensorDictModule``, ``[E, T]`` buffers cloned per batch)
with E envs, and the ceiling is the sum of their frames/s. A collector cannot beat it: it does
the same work plus moving every batch to the trainer process, which on a small machine competes
with the workers for the cores.

Four contenders are built once and warmed up (imports, start-up and first batches are never
timed), then take **turns** of ``--turn-batches`` worker batches each, the order rotating, for
``--turns`` turns, so a change in the machine's load hits all of them alike:

* ``ceiling``: a :class:`~acollect.cli._reference_loops.LoopPool` of N loop processes of E envs,
  released together by a barrier at each turn;
* ``MultiAsyncCollector``: N workers x E envs, each batch one worker's ``[E, T]``; the batches its
  workers collected ahead while the others had their turn are taken first. Each worker is timed as
  a ceiling process is: its ``--turn-batches`` batches over its own time (from before those first
  hand-outs, whose credits start it, to the hand-out of its last batch), the workers' rates added.
  Counting N x ``--turn-batches`` batches in all instead ends a turn at the slower worker's last
  batch with the other part-way through its next, a rounding loss that a long run does not have;
  that reading is printed too ("to each turn's last batch");
* ``MultiSyncCollector``: N workers x E envs, ``--frames-per-batch`` frames per batch from all, so
  each worker's share is the same ``[E, T]`` (its workers collect only when asked);
* ``one hand loop``: a pool of one loop process of E envs (what one core does alone).

With ``--affinity``, two more: the same two collectors with ``worker_affinity="auto"`` (each worker pinned to a
core of its own, the trainer to the cores left), reported as ratios to their unpinned selves. With fewer workers
than cores the pinned collectors pin the trainer's threads while they are open, that is for the whole run: every
contender's trainer side then runs on the cores left (the loop processes are never pinned).

Between turns the idle contenders wait without using CPU. Two clocks: wall time (frames/s; for
the ceiling, the sum of the processes' frames/s), and CPU time of every process involved (the
trainer and its workers, or the loop processes), the latter barely disturbed by other jobs.

    python benchmarks/ceiling.py --json docs/data/ceiling.json                           # 2 x 16
    python benchmarks/ceiling.py --workers 8 --envs 8 --json docs/data/ceiling-8x8.json  # 16 cores
    python benchmarks/ceiling.py --turns 3 --affinity --json docs/data/ceiling-affinity.json  # pinned or not

Run ``python benchmarks/ceiling.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, Turns, cpu_of, machine_info, make_policy, settle, single_thread_torch, write_json

from acollect import GymEnv, MultiAsyncCollector, MultiSyncCollector
from acollect.cli._reference_loops import LoopPool

CEILING, ASYNC, SYNC, SINGLE = "ceiling", "MultiAsyncCollector", "MultiSyncCollector", "one hand loop"
ASYNC_PINNED, SYNC_PINNED = "MultiAsyncCollector auto", "MultiSyncCollector auto"  # worker_affinity="auto"
CREDITS = 2  # MultiAsyncCollector's default: batches each worker may collect ahead


def goals(workers: int, affinity: bool = False) -> list[tuple[str, str, float | None]]:
    """(contender, reference, goal) for each ratio reported: the goals of docs/performance.md's table."""
    if workers == 2:  # 2 x 16 on a 2-core machine
        found = [(ASYNC, CEILING, 0.95), (SYNC, CEILING, 0.9), (SYNC, SINGLE, 1.7)]
    else:
        found = [(ASYNC, CEILING, 0.9), (SYNC, CEILING, 0.9), (SYNC, SINGLE, None)]  # 8 x 8 on 16 cores
    if affinity:  # pinned against unpinned: no goal, a measurement
        found += [(ASYNC_PINNED, ASYNC, None), (SYNC_PINNED, SYNC, None), (ASYNC_PINNED, CEILING, None),
                  (SYNC_PINNED, CEILING, None)]  # fmt: skip
    return found


async def _collector_turn(collector: Any, pids: list[int], batches: int, drain: int) -> tuple[int, float, float]:
    """``batches`` batches after ``drain`` untimed ones: (frames, wall s, CPU s of the trainer and workers)."""
    for _ in range(drain):
        await anext(collector)
    cpu, workers_cpu, wall = time.process_time(), cpu_of(pids), time.perf_counter()
    frames = 0
    for _ in range(batches):
        frames += (await anext(collector)).numel()
    wall = time.perf_counter() - wall
    return frames, wall, time.process_time() - cpu + cpu_of(pids) - workers_cpu


async def _per_worker_turn(
    collector: Any, pids: list[int], workers: int, batches: int, drain: int, last: list[float]
) -> tuple[int, float, float]:
    """Each worker's first ``batches`` batches of the turn over its own time, as the ceiling's processes are timed.

    A count of ``workers x batches`` batches in all would end the turn at the slower worker's last batch while the
    faster one is part-way through its next: up to a batch of a worker's time lost to rounding, a few percent over
    short turns, which a long run never sees (a first-ready collector hands out whichever batch is ready). So each
    worker's rate is its ``batches`` batches over the time from the turn's start to the hand-out of its last one;
    the rates add up as the ceiling's do. The clock starts before the ``drain`` batches collected ahead are taken,
    since taking them sends the credits that start the workers (their hand-out is in the workers' time). Batches
    past a worker's count are taken and not counted (their hand-out still costs the trainer's CPU within the turn).
    ``last`` gets the other reading: frames/s to the turn's ``workers x batches``-th batch, from the drain's end.
    """
    # The workers' clock starts before the batches they collected ahead are taken: each credit those hand-outs
    # send starts a worker, which must not start before its clock (a ceiling process starts with its own).
    start = time.perf_counter()
    for _ in range(drain):
        await anext(collector)
    cpu, workers_cpu, wall = time.process_time(), cpu_of(pids), time.perf_counter()
    done: dict[int, float] = {}  # worker: seconds from the start to the hand-out of its last counted batch
    seen = [0] * workers
    frames = taken = per_batch = 0
    while len(done) < workers:
        batch = await anext(collector)
        worker = int(batch.get(("collector", "worker_id"))[(0,) * batch.ndim])
        per_batch = batch.numel()
        taken += 1
        if taken == workers * batches:
            last.append(taken * per_batch / (time.perf_counter() - wall))
        if seen[worker] < batches:
            seen[worker] += 1
            frames += per_batch
            if seen[worker] == batches:
                done[worker] = time.perf_counter() - start
        del batch
    cpu_s = time.process_time() - cpu + cpu_of(pids) - workers_cpu
    rate = sum(batches * per_batch / seconds for seconds in done.values())
    # As the ceiling's: frames over their equivalent seconds; CPU is the turn's, for the frames counted.
    return frames, frames / rate, cpu_s * frames / (taken * per_batch)


async def _pool_turn(pool: LoopPool, batches: int) -> tuple[int, float, float]:
    loops = await asyncio.to_thread(pool.run, batches)  # the event loop keeps serving the collectors meanwhile
    # frames / seconds is then the sum of the processes' frames/s.
    return loops.frames, loops.frames / loops.frames_per_s, sum(p.cpu_s for p in loops.processes)


async def _enter(stack: AsyncExitStack, collector: Any, warmup: int) -> tuple[Any, list[int]]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    await stack.enter_async_context(collector)
    for _ in range(warmup):
        await anext(collector)  # also makes sure every worker has started
    pids = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    return collector, pids


async def measure(args: argparse.Namespace) -> tuple[Turns, list[str], dict[str, list[float]]]:
    n, e, per_worker = args.workers, args.envs, args.frames_per_batch // args.workers
    k = args.turn_batches
    turns, log = Turns(), []
    to_last: dict[str, list[float]] = {ASYNC: [], ASYNC_PINNED: []}  # frames/s to each turn's last batch
    async with AsyncExitStack() as stack:
        env = functools.partial(GymEnv, ENV_ID, num_envs=e)
        multi_async, async_pids = await _enter(stack, MultiAsyncCollector(
            env, make_policy(), num_workers=n, frames_per_batch=per_worker, total_frames=-1, credits=CREDITS,
        ), args.warmup * n)  # fmt: skip
        multi_sync, sync_pids = await _enter(stack, MultiSyncCollector(
            env, make_policy(), num_workers=n, frames_per_batch=args.frames_per_batch, total_frames=-1,
        ), args.warmup)  # fmt: skip
        pinned: list[tuple[str, Callable[[], Awaitable[tuple[int, float, float]]]]] = []
        pinned_pids: list[int] = []
        if args.affinity:
            async_auto, async_auto_pids = await _enter(stack, MultiAsyncCollector(
                env, make_policy(), num_workers=n, frames_per_batch=per_worker, total_frames=-1, credits=CREDITS,
                worker_affinity="auto",
            ), args.warmup * n)  # fmt: skip
            sync_auto, sync_auto_pids = await _enter(stack, MultiSyncCollector(
                env, make_policy(), num_workers=n, frames_per_batch=args.frames_per_batch, total_frames=-1,
                worker_affinity="auto",
            ), args.warmup)  # fmt: skip
            pinned_pids = async_auto_pids + sync_auto_pids
            pinned = [
                (
                    ASYNC_PINNED,
                    lambda: _per_worker_turn(async_auto, async_auto_pids, n, k, n * CREDITS, to_last[ASYNC_PINNED]),
                ),
                (SYNC_PINNED, lambda: _collector_turn(sync_auto, sync_auto_pids, k, drain=1)),
            ]
            print(f"worker_affinity='auto': trainer on {async_auto.trainer_cores or 'every core (none left)'}, "
                  f"workers on {[c.affinity for c in async_auto.worker_configs]}", flush=True)  # fmt: skip
        pool_args = {"warmup": args.warmup, "timeout": args.timeout}
        ceiling = await asyncio.to_thread(functools.partial(LoopPool, n, e, per_worker, seed=0, **pool_args))
        stack.callback(ceiling.close)
        single = await asyncio.to_thread(functools.partial(LoopPool, 1, e, per_worker, seed=100, **pool_args))
        stack.callback(single.close)
        runs: list[tuple[str, Callable[[], Awaitable[tuple[int, float, float]]]]] = [
            (CEILING, lambda: _pool_turn(ceiling, k)),
            (ASYNC, lambda: _per_worker_turn(multi_async, async_pids, n, k, n * CREDITS, to_last[ASYNC])),
            (SYNC, lambda: _collector_turn(multi_sync, sync_pids, k, drain=1)),
            (SINGLE, lambda: _pool_turn(single, k)),
            *pinned,
        ]
        for index in range(args.turns):
            shift = index % len(runs)  # the order rotates: no contender always follows the same one
            line = []
            for name, run in runs[shift:] + runs[:shift]:
                # Untimed: the collectors finish collecting ahead after their last turn (MultiAsync refills its
                # credits), which would otherwise run inside this turn; each collector's turn drains that first.
                await settle(async_pids + sync_pids + pinned_pids, interval=0.1)
                frames, wall, cpu = await run()
                turns.add(name, frames, wall, cpu)
                line.append(f"{name} {frames / wall:,.0f}")
            log.append(f"turn {index + 1}/{args.turns}: " + ", ".join(line) + " frames/s")
            print(log[-1], flush=True)
    return turns, log, {name: rates for name, rates in to_last.items() if rates}


def summarize(
    turns: Turns, workers: int, affinity: bool = False, to_last: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    rates = turns.rates()
    ratios = []
    for contender, reference, goal in goals(workers, affinity):
        wall = [c / r for c, r in zip(turns.turn_rates(contender), turns.turn_rates(reference), strict=True)]
        ratios.append({"contender": contender, "reference": reference, "goal": goal,
                       "wall": rates[contender]["wall"] / rates[reference]["wall"],
                       "cpu": rates[contender]["cpu"] / rates[reference]["cpu"], "wall_per_turn": wall})  # fmt: skip
    # The other reading of a first-ready collector's turns (see _per_worker_turn): every turn counts the same frames,
    # so frames over seconds is the harmonic mean of the turns' rates.
    last = {name: len(r) / sum(1 / x for x in r) / rates[CEILING]["wall"] for name, r in (to_last or {}).items()}
    return {"frames_per_s": rates, "ratios": ratios, "to_last_batch_over_ceiling": last}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=2, help="worker processes, and independent loop processes")
    parser.add_argument("--envs", type=int, default=16, help="CartPole envs per worker (and per loop process)")
    parser.add_argument("--frames-per-batch", type=int, default=2048, help="MultiSync frames per batch, all workers")
    parser.add_argument("--turns", type=int, default=12, help="turns per contender")
    parser.add_argument("--turn-batches", type=int, default=8, help="timed batches per worker (or process) per turn")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per worker / process first")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the loop processes may take per step")
    parser.add_argument(
        "--affinity",
        action="store_true",
        help='also time both collectors with worker_affinity="auto", turn about with the others',
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    for name in ("workers", "envs", "frames_per_batch", "turns", "turn_batches"):
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
    t = args.frames_per_batch // args.workers // args.envs
    print(f"{ENV_ID}, {args.workers} workers x {args.envs} envs, worker batches [{args.envs}, {t}], {args.turns} "
          f"turns of {args.turn_batches} batches per worker, {machine['cpu_count']} cores")  # fmt: skip
    turns, log, to_last = asyncio.run(measure(args))
    summary = summarize(turns, args.workers, args.affinity, to_last)
    print(f"\n{'what':<24}{'wall frames/s':>15}{'cpu frames/s':>15}")
    for name, r in summary["frames_per_s"].items():
        print(f"{name:<24}{r['wall']:>15,.0f}{r['cpu']:>15,.0f}")
    for ratio in summary["ratios"]:
        goal = ratio["goal"]
        verdict = "" if goal is None else f" ({'meets' if ratio['wall'] >= goal else 'misses'} the goal of {goal}x)"
        print(f"{ratio['contender']} / {ratio['reference']} = {ratio['wall']:.2f}x wall, {ratio['cpu']:.2f}x cpu"
              f"{verdict}")  # fmt: skip
    for name, ratio in summary["to_last_batch_over_ceiling"].items():
        print(f"{name} / {CEILING} = {ratio:.2f}x wall counted to each turn's last batch, not per worker")
    payload = {
        "benchmark": "ceiling",
        "env": ENV_ID,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine,
        "turns": turns.as_dict(),
        "log": log,
        **summary,
    }
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
