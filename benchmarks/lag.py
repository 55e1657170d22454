"""Event-loop lag while a collector fills a replay buffer in the background and the trainer samples from it.

The set-up of an async trainer: ``collector.start(replay_buffer=rb)`` collects batch after batch
into an :class:`acollect.ReplayBuffer` while the main task samples from it (``rb.sample(256)``,
then ``await anyio.sleep(0)``, as fast as it can). A third task, the ticker, sleeps 1 ms at a time
and records how late it wakes: the lag any other task of the trainer (a heartbeat, a web handler,
a weight push) would see. Python's garbage collections are recorded too (``gc.callbacks``: the
duration of every one, whichever thread ran it, and its generation). On Linux each tick also records
how long the loop's thread sat on a run queue, ready but descheduled
(``/proc/thread-self/schedstat``): on a machine other jobs load, "p99 net of run-queue wait" is the
lateness this process caused itself (its own work, and waits for the GIL).

Last, how long writing one batch holds the loop: ``rb.extend(batch)`` in one piece, against the longest
slice of ``await rb.aextend(batch)`` (what background mode does), for a CartPole batch and a pixel batch.

Contenders, each for ``--seconds`` per round, rounds in turns:

* ``baseline``: the ticker and the sampler alone, on a buffer filled beforehand (the floor);
* ``Collector``: in-process, ``GymEnv("CartPole-v1", num_envs=8)``, 2048 frames per batch;
* ``Collector-no-handover``: the same with ``gil_handover_interval=None`` (the collection thread never offers
  the GIL to the loop between steps: what threads do by themselves);
* ``MultiSyncCollector``: 2 workers x 16 envs, 2048 frames per batch (on 2 cores, the workers and the
  trainer share them);
* ``MultiSyncCollector-1``: 1 worker x 16 envs, 2048 frames per batch (a core left to the trainer).

The policy is the reference MLP in a ``TensorDictModule``. The goal is a p99 lateness of at most
2 ms with worker processes and 6 ms in-process (about one switch interval of the GIL the collection
thread shares with the loop), and no garbage collection of acollect's making over 10 ms.

    python benchmarks/lag.py --json docs/data/lag.json

Run ``python benchmarks/lag.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, machine_info, make_policy, single_thread_torch, write_json

from acollect import Collector, GymEnv, MultiSyncCollector, ReplayBuffer

TICK_S = 0.001
SAMPLE = 256
GOAL_P99_MS = 2.0  # worker processes: the loop only moves batches
#: in-process: the collection thread shares the loop's GIL, and about one switch interval is the goal
GOAL_P99_MS_IN_PROCESS = 6.0
GOAL_GC_MS = 10.0
KINDS = ("baseline", "Collector", "Collector-no-handover", "MultiSyncCollector", "MultiSyncCollector-1")


class GCPauses:
    """Durations of Python's garbage collections while :meth:`watch` is on, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.pauses: list[dict[str, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        # A collection holds the GIL from start to stop: one start time at a time is enough.
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append({"ms": (time.perf_counter() - self._started) * 1e3, "generation": info["generation"],
                                "collected": info["collected"]})  # fmt: skip

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def _run_queue_ms() -> float:
    """Milliseconds this thread has waited on a run queue, ready to run (Linux; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except OSError:
        return 0.0


def percentile(xs: list[float], q: float) -> float:
    """The ``q``-quantile by nearest rank (``nan`` for no value)."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def _measure(rb: ReplayBuffer, seconds: float) -> dict[str, Any]:
    """Runs the ticker and the sampler for ``seconds``; returns the lateness (ms) and what was sampled."""
    late_ms: list[float] = []
    net_ms: list[float] = []  # lateness less the run-queue wait during the tick
    samples = 0
    end = time.perf_counter() + seconds

    async def ticker() -> None:
        while time.perf_counter() < end:
            queued = _run_queue_ms()
            before = time.perf_counter()
            await anyio.sleep(TICK_S)
            late_ms.append((time.perf_counter() - before - TICK_S) * 1e3)
            net_ms.append(late_ms[-1] - (_run_queue_ms() - queued))

    async def sampler() -> None:
        nonlocal samples
        while time.perf_counter() < end:
            rb.sample(SAMPLE)
            samples += 1
            await anyio.lowlevel.checkpoint()  # let the ticker and the loop run between samples

    with GCPauses() as gcs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(sampler)
    return {"late_ms": late_ms, "net_ms": net_ms, "samples_per_s": samples / seconds, "gc": gcs.pauses}


def _collector(kind: str, args: argparse.Namespace) -> Any:
    policy = make_policy()
    if kind.startswith("Collector"):
        handover = {"gil_handover_interval": None} if kind == "Collector-no-handover" else {}
        return Collector(
            functools.partial(GymEnv, ENV_ID, num_envs=8), policy, frames_per_batch=args.frames_per_batch,
            total_frames=-1, **handover,
        )  # fmt: skip
    return MultiSyncCollector(
        functools.partial(GymEnv, ENV_ID, num_envs=16), policy, num_workers=1 if kind.endswith("-1") else 2,
        frames_per_batch=args.frames_per_batch, total_frames=-1,
    )  # fmt: skip


async def _round(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    rb = ReplayBuffer(capacity=args.capacity)
    if kind == "baseline":  # a buffer of real batches, then nothing else running
        async with _collector("Collector", args) as collector:
            for _ in range(4):
                rb.extend(await anext(collector))
        result = await _measure(rb, args.seconds)
        result["frames_per_s"] = 0.0
        return result
    async with _collector(kind, args) as collector:
        collector.start(replay_buffer=rb)
        with anyio.fail_after(args.startup_timeout):  # start-up and the first batches are not measured
            while len(rb) < 2 * args.frames_per_batch:  # noqa: ASYNC110 - a buffer has no event to wait on
                await anyio.sleep(0.01)
        frames = collector.frames
        result = await _measure(rb, args.seconds)
        result["frames_per_s"] = (collector.frames - frames) / args.seconds
        await collector.async_shutdown()
    return result


async def _longest_hold_ms(write: Any, batch: Any, capacity: int) -> float:
    """The longest the loop's other tasks waited while ``write(rb, batch)`` ran: one stretch without a checkpoint."""
    rb = ReplayBuffer(capacity=capacity)
    await write(rb, batch)  # storage allocated and pages touched: the measured writes overwrite
    gaps: list[float] = []
    writing = True

    async def watcher() -> None:
        last = time.perf_counter()
        while writing:
            await anyio.lowlevel.checkpoint()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(watcher)
        await anyio.lowlevel.checkpoint()
        await write(rb, batch)
        writing = False
    return max(gaps) * 1e3


async def _writes(args: argparse.Namespace) -> dict[str, Any]:
    """How long writing one batch holds the loop: ``extend`` in one piece, ``aextend`` slice by slice."""
    async with _collector("Collector", args) as collector:
        cartpole = await anext(collector)
    pixels = TensorDict({"pixels": torch.zeros(8, 32, 84, 84, 4, dtype=torch.uint8),
                         "next": {"pixels": torch.zeros(8, 32, 84, 84, 4, dtype=torch.uint8)}},
                        batch_size=[8, 32])  # fmt: skip

    async def extend(rb: ReplayBuffer, batch: Any) -> None:
        rb.extend(batch)

    async def aextend(rb: ReplayBuffer, batch: Any) -> None:
        await rb.aextend(batch)

    writers = {"extend": extend, **({"aextend": aextend} if hasattr(ReplayBuffer, "aextend") else {})}
    result: dict[str, Any] = {}
    for name, batch, capacity in (("CartPole 2048 frames", cartpole, 20_000), ("pixels 256 frames", pixels, 1_024)):
        for how, write in writers.items():
            holds = sorted([await _longest_hold_ms(write, batch, capacity) for _ in range(21)])
            result[f"{name}, {how}"] = {"median_ms": holds[len(holds) // 2], "max_ms": holds[-1]}
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    late = [x for r in results for x in r["late_ms"]]
    net = [x for r in results for x in r["net_ms"]]
    pauses = [p["ms"] for r in results for p in r["gc"]]
    return {
        "ticks": len(late),
        "late_p50_ms": percentile(late, 0.50),
        "late_p99_ms": percentile(late, 0.99),
        "late_max_ms": max(late, default=float("nan")),
        "late_p99_ms_per_round": [percentile(r["late_ms"], 0.99) for r in results],
        "net_of_run_queue_p99_ms": percentile(net, 0.99),
        "net_of_run_queue_p99_ms_per_round": [percentile(r["net_ms"], 0.99) for r in results],
        "gc_count": len(pauses),
        "gc_max_ms": max(pauses, default=0.0),
        "gc_total_ms": sum(pauses),
        "gc_over_1ms": sorted(([p for r in results for p in r["gc"] if p["ms"] > 1.0]), key=lambda p: -p["ms"]),
        "samples_per_s": [r["samples_per_s"] for r in results],
        "frames_per_s": [r["frames_per_s"] for r in results],
    }


def _round_record(result: dict[str, Any]) -> dict[str, Any]:
    late = result["late_ms"]
    lateness = {"ticks": len(late), "late_p50_ms": percentile(late, 0.5), "late_p99_ms": percentile(late, 0.99),
                "late_max_ms": max(late, default=float("nan")),
                "net_of_run_queue_p99_ms": percentile(result["net_ms"], 0.99)}  # fmt: skip
    pauses = result["gc"]  # hundreds per round: the JSON keeps their count, total and the ones over 1 ms
    gcs = {"gc_count": len(pauses), "gc_total_ms": sum(p["ms"] for p in pauses),
           "gc_over_1ms": [p for p in pauses if p["ms"] > 1.0]}  # fmt: skip
    return {**{k: v for k, v in result.items() if k not in ("late_ms", "net_ms", "gc")}, **lateness, **gcs}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per contender and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--frames-per-batch", type=int, default=2048)
    parser.add_argument("--capacity", type=int, default=100_000, help="replay buffer capacity (transitions)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--only", default=",".join(KINDS), help=f"contenders, comma-separated (default: {KINDS})")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    single_thread_torch()
    machine = machine_info()
    kinds = tuple(args.only.split(","))
    if set(kinds) - set(KINDS):
        parser.error(f"unknown contenders {sorted(set(kinds) - set(KINDS))}: choose among {KINDS}")
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind in kinds:
            rounds[kind].append(anyio.run(_round, kind, args, backend=args.backend))
            s = summarize(rounds[kind][-1:])
            print(f"round {r + 1}/{args.rounds} {kind:<21} lateness p50 {s['late_p50_ms']:.2f} ms, p99 "
                  f"{s['late_p99_ms']:.2f} ms (net of run-queue wait {s['net_of_run_queue_p99_ms']:.2f}), max "
                  f"{s['late_max_ms']:.1f} ms; GC max {s['gc_max_ms']:.1f} ms ({s['gc_count']}); "
                  f"{s['frames_per_s'][0]:,.0f} frames/s", flush=True)  # fmt: skip
    summary = {kind: summarize(results) for kind, results in rounds.items()}
    writes = anyio.run(_writes, args, backend=args.backend)
    print(f"\n{'what':<22}{'p50 ms':>9}{'p99 ms':>9}{'net p99':>9}{'max ms':>9}{'GC max ms':>11}{'GCs':>6}"
          f"{'frames/s':>10}")  # fmt: skip
    for kind, s in summary.items():
        frames = sum(s["frames_per_s"]) / len(s["frames_per_s"])
        print(f"{kind:<22}{s['late_p50_ms']:>9.2f}{s['late_p99_ms']:>9.2f}{s['net_of_run_queue_p99_ms']:>9.2f}"
              f"{s['late_max_ms']:>9.1f}{s['gc_max_ms']:>11.1f}{s['gc_count']:>6}{frames:>10,.0f}")  # fmt: skip
    print("\nthe longest the loop waits while one batch is written (median and max of 21 writes):")
    for what, hold in writes.items():
        print(f"  {what:<32}{hold['median_ms']:>8.2f} ms{hold['max_ms']:>8.2f} ms")
    print(f"goal: p99 <= {GOAL_P99_MS} ms with worker processes, <= {GOAL_P99_MS_IN_PROCESS} ms in-process; "
          f"GC pauses of acollect's making <= {GOAL_GC_MS} ms")  # fmt: skip
    payload = {
        "benchmark": "lag",
        "env": ENV_ID,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine,
        "tick_s": TICK_S,
        "sample_size": SAMPLE,
        # Every tick's lateness would be tens of thousands of numbers: each round keeps its GC pauses and rates.
        "rounds": {kind: [_round_record(r) for r in rs] for kind, rs in rounds.items()},
        "summary": summary,
        "longest_hold_while_writing_a_batch": writes,
        "goal_p99_ms": GOAL_P99_MS,
        "goal_p99_ms_in_process": GOAL_P99_MS_IN_PROCESS,
        "goal_gc_ms": GOAL_GC_MS,
    }
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
