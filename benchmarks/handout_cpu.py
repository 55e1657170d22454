"""The trainer's CPU per batch handed out: what a small batch costs the process that consumes it.

Two workers of ``CountingEnv`` (4 envs each, a step costs next to nothing) and 64-frame batches: the workers are
never the limit, and what is measured is the trainer's own work per batch (receiving and checking the message,
building the TensorDict, the bookkeeping, giving the credit back). ``time.process_time()`` over ``--batches``
batches, after a warm-up, for ``MultiAsyncCollector`` and ``MultiSyncCollector`` (whose batch is two parts).

    python benchmarks/handout_cpu.py --batches 1500 --runs 3
    python benchmarks/handout_cpu.py --workers 128 --step-ms 20 --kinds MultiAsyncCollector --batches 600 --runs 1

With many workers on few cores, ``--step-ms`` makes every env step sleep (``SlowEnv``): the workers then leave the
cores to the trainer, whose CPU per batch is what fans in from them all.

``--kinds RayCollector``: the workers are Ray actors (``RayCollector(..., sync=False)``: first ready, as
``MultiAsyncCollector``) of a local Ray cluster this script starts with ``ray.init(num_cpus=--ray-cpus)``
(logical CPUs: each actor asks for one, so 16 actors need 16 of them whatever the cores), batches over tcp.
Ray's own threads in the trainer's process (its core worker, gRPC) count in its CPU time: the figure is what the
trainer's process spends, and the idle rate of those threads is reported beside it. Each Ray run also reports
the time to the first batch and until every actor had delivered one, whether every actor's frames arrived in
the timed batches, the actors' own memory (USS of the ``ray::_WorkerActor`` processes), and what is left after
the collector's shutdown (actor processes still running) and after ``ray.shutdown()`` (processes this one
started)::

    python benchmarks/handout_cpu.py --workers 16 --step-ms 2.5 --kinds RayCollector,MultiAsyncCollector \\
        --baseline 2:0.31 --batches 400 --runs 3

``--baseline W:S`` adds a contender taking its turn in every run: ``MultiAsyncCollector`` with ``W`` local workers
whose steps sleep ``S`` ms (``2:0.31`` gives the same batch rate as 16 workers at 2.5 ms, about 400 a second).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from acollect import MultiAsyncCollector, MultiSyncCollector, RayCollector
from acollect.testing import CountingEnv, SlowEnv

MIB = 1 << 20
#: the title Ray gives the process of an actor of acollect's Ray launcher (its class, and the call it runs)
_RAY_ACTOR_TITLE = "ray::_WorkerActor"


def _ray_actor_pids() -> list[int]:
    import psutil

    pids = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if cmdline and cmdline[0].startswith(_RAY_ACTOR_TITLE):
            pids.append(process.pid)
    return pids


def _uss_mib(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).memory_full_info().uss / MIB
    except psutil.Error:
        return None


def _workers_in(batch: Any) -> set[int]:
    """The workers whose frames ``batch`` holds: tagged per frame, or one row each where lockstep parts are stacked."""
    ids = batch.get(("collector", "worker_id"), None)
    return set(ids.unique().tolist()) if ids is not None else set(range(int(batch.shape[0])))


async def measure(kind: type, workers: int, batches: int, step_ms: float = 0.0) -> dict[str, Any]:
    """This process's CPU per batch handed out (ms), and for Ray the start-up, arrivals, memory and leftovers."""
    env = (
        functools.partial(SlowEnv, step_ms / 1000, num_envs=4)
        if step_ms
        else functools.partial(CountingEnv, num_envs=4)
    )
    envs = [env] * workers
    ray = kind is RayCollector
    options: dict[str, Any] = {"sync": False, "remote_configs": {"num_cpus": 1}} if ray else {}
    created = time.perf_counter()
    collector = kind(envs, None, frames_per_batch=64, total_frames=-1, **options)
    row: dict[str, Any] = {}
    try:
        seen: set[int] = set()
        async for batch in collector:  # warm: workers started, memory reused; at least 50 batches
            if not seen:
                row["first_batch_s"] = round(time.perf_counter() - created, 2)
            seen.update(_workers_in(batch))
            if len(seen) == workers and "every_worker_s" not in row:
                row["every_worker_s"] = round(time.perf_counter() - created, 2)
            if len(seen) == workers and collector.stats().batches >= 50:
                break
            if time.perf_counter() - created > 600:
                raise TimeoutError(f"only workers {sorted(seen)} of {workers} delivered a batch in 600 s")
        timed: set[int] = set()
        frames = 0
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(batches):
            batch = await anext(collector)
            frames += batch.numel()
            timed.update(_workers_in(batch))
        row["cpu_ms"] = 1000 * (time.process_time() - cpu) / batches
        row["batches_per_s"] = round(batches / (time.perf_counter() - wall), 1)
        row["frames_per_batch"] = frames / batches
        row["workers_in_timed_batches"] = len(timed)
        if ray:
            uss = [m for m in map(_uss_mib, _ray_actor_pids()) if m is not None]
            row["actors_found"] = len(uss)
            row["actor_uss_mib_mean"] = round(statistics.mean(uss), 1) if uss else None
    finally:
        await collector.async_shutdown()
    return row


def _actors_left(timeout: float = 10.0) -> int:
    """The actor processes still running after a collector's shutdown (a killed actor's takes a moment to exit)."""
    deadline = time.monotonic() + timeout
    while _ray_actor_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(_ray_actor_pids())


def _ray_idle_cpu_ms_per_s(seconds: float = 3.0) -> float:
    """The CPU Ray's own threads in this process spend per second with nothing to do (ms/s)."""
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return 1000 * (time.process_time() - cpu) / (time.perf_counter() - wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=0.0, help="each env step sleeps this long (SlowEnv)")
    parser.add_argument("--kinds", default="MultiAsyncCollector,MultiSyncCollector",
                        help="comma-separated: MultiAsyncCollector, MultiSyncCollector, RayCollector")  # fmt: skip
    parser.add_argument("--ray-cpus", type=int, default=None, help="logical CPUs of the local Ray cluster "
                        "(default: --workers, one per actor)")  # fmt: skip
    parser.add_argument("--baseline", default=None, metavar="W:S", help="also MultiAsyncCollector with W local "
                        "workers whose steps sleep S ms, in every run")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    names = args.kinds.split(",")
    kinds = [k for k in (RayCollector, MultiAsyncCollector, MultiSyncCollector) if k.__name__ in names]
    extra: dict[str, Any] = {}
    if RayCollector in kinds:
        import psutil
        import ray

        # On the main thread, once: a local cluster's processes die with the thread that started them.
        ray.init(num_cpus=args.ray_cpus or args.workers, include_dashboard=False, log_to_driver=False)
        extra["ray_idle_cpu_ms_per_s"] = round(_ray_idle_cpu_ms_per_s(), 2)
        ours = {p.pid for p in psutil.Process().children(recursive=True)}
    contenders = [(kind.__name__, kind, args.workers, args.step_ms) for kind in kinds]
    if args.baseline is not None:
        w, s = args.baseline.split(":")
        contenders.append((f"MultiAsyncCollector, {w} workers at {s} ms", MultiAsyncCollector, int(w), float(s)))
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(args.runs):
            for name, kind, workers, step_ms in contenders:  # alternating, run after run
                row = asyncio.run(measure(kind, workers, args.batches, step_ms))
                if kind is RayCollector:
                    row["actor_processes_after_shutdown"] = _actors_left()
                row["load_average_1min"] = os.getloadavg()[0]
                results.setdefault(name, []).append(row)
                print(f"  {name}: {json.dumps(row)}", flush=True)
    finally:
        if RayCollector in kinds:
            ray.shutdown()
            time.sleep(2.0)
            left = [p for p in psutil.Process().children(recursive=True) if p.pid in ours and p.is_running()]
            extra["processes_left_after_ray_shutdown"] = len(left)
    for name, rows in results.items():
        values = [r["cpu_ms"] for r in rows]
        workers = "" if "workers" in name else f" {args.workers} workers"
        print(f"{name}{workers}: {statistics.median(values):.3f} ms CPU per 64-frame batch (runs: "
              + ", ".join(f"{v:.3f}" for v in values) + ")")  # fmt: skip
    if extra:
        print(json.dumps(extra))
    if args.json is not None:
        payload = {"args": {k: str(v) for k, v in vars(args).items()}, "load_average_at_the_end": os.getloadavg(),
                   "results": results, **extra}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
