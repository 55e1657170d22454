"""Start-up and memory against the number of workers: time to the first batch, and each worker's own memory.

For each number of workers, a fresh interpreter (so that every count pays for its own fork server, as a new
program does) builds a ``MultiAsyncCollector`` of that many workers, each one ``SlowEnv`` (every step sleeps, so
that 2 cores are not what limits 128 workers), with the default options unless ``--start-method`` says otherwise,
and reports:

* **first batch**: seconds from the collector's construction to its first batch. A collector hands out nothing
  before every worker said hello, so this is the time for all of them to start and build their envs;
* **every worker**: seconds until every worker delivered at least one batch;
* **worker USS**: each worker's own memory (``psutil``'s ``memory_full_info().uss``: the pages no other process
  shares), its mean and largest, once every worker delivered a batch; with each worker's proportional share of
  the pages it shares (PSS, mean), and the fork server's resident memory (RSS: the modules the workers share);
* **shutdown**: seconds ``async_shutdown()`` took.

Imports in the trainer come before the clock starts (a program pays them whatever it starts). A count that does
not reach its first batch within ``--timeout`` seconds is reported as failed, with the reason.

Run: ``python benchmarks/startup.py [--workers 2 8 32 128] [--start-method spawn] [--json out.json]``.
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
from typing import Any

from _common import machine_info, write_json

MIB = 2**20


def _memory_mib(pid: int) -> tuple[float, float, float] | None:
    """The process's USS, PSS and RSS in MiB (``None`` once it is gone)."""
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return None
    return info.uss / MIB, info.pss / MIB, info.rss / MIB


def _cmdline(process: Any) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _fork_server_pid() -> int | None:
    import psutil

    servers = [c.pid for c in psutil.Process().children() if "multiprocessing.forkserver" in _cmdline(c)]
    return servers[0] if servers else None


async def _one(workers: int, start_method: str | None, step_time: float, frames: int) -> dict[str, Any]:
    """One count, in this interpreter (a fresh one: see :func:`main`)."""
    from acollect import MultiAsyncCollector
    from acollect.testing import SlowEnv

    options: dict[str, Any] = {} if start_method is None else {"start_method": start_method}
    created = time.perf_counter()
    collector = MultiAsyncCollector(
        [functools.partial(SlowEnv, step_time)] * workers, frames_per_batch=frames, **options
    )
    seen: set[int] = set()
    first = every = None
    try:
        async for batch in collector:
            if first is None:
                first = time.perf_counter() - created
            seen.add(int(batch["collector", "worker_id"].flatten()[0]))
            if len(seen) == workers:
                every = time.perf_counter() - created
                break
        pids = [pid for pid in collector.worker_pids if pid is not None]
        memory = [m for m in map(_memory_mib, pids) if m is not None]
        server = _fork_server_pid()
        server_memory = _memory_mib(server) if server is not None else None
    finally:
        closing = time.perf_counter()
        await collector.async_shutdown()
        shutdown = time.perf_counter() - closing
    return {
        "workers": workers,
        "start_method": collector.settings.start_method,
        "first_batch_s": round(first or float("nan"), 2),
        "every_worker_s": round(every or float("nan"), 2),
        "worker_uss_mib_mean": round(statistics.mean(m[0] for m in memory), 1) if memory else None,
        "worker_uss_mib_max": round(max(m[0] for m in memory), 1) if memory else None,
        "worker_pss_mib_mean": round(statistics.mean(m[1] for m in memory), 1) if memory else None,
        "fork_server_rss_mib": round(server_memory[2], 1) if server_memory is not None else None,
        "shutdown_s": round(shutdown, 2),
    }


def _run_count(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    """Runs one count in a fresh interpreter, under ``--timeout``; a failure is reported, not raised."""
    command = [sys.executable, __file__, "--one", str(workers), "--step-time", str(args.step_time),
               "--frames", str(args.frames)]  # fmt: skip
    if args.start_method is not None:
        command += ["--start-method", args.start_method]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"workers": workers, "failed": f"no result within --timeout {args.timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"workers": workers, "failed": f"exit code {done.returncode}: {reason}"}
    return {**json.loads(lines[-1]), "wall_s": round(time.perf_counter() - began, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8, 32, 128], help="the counts, in turn")
    parser.add_argument("--start-method", choices=["forkserver", "spawn"], default=None,
                        help="default: the collectors' default")  # fmt: skip
    parser.add_argument("--step-time", type=float, default=0.01, help="seconds each env step sleeps")
    parser.add_argument("--frames", type=int, default=16, help="frames per batch (one worker's)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one count may take in all")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: one count
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(asyncio.run(_one(args.one, args.start_method, args.step_time, args.frames))), flush=True)
        return
    machine = machine_info()
    rows = []
    print(f"{'workers':>8} {'first batch':>12} {'every worker':>13} {'worker USS mean/max':>20} "
          f"{'PSS mean':>9} {'server RSS':>11} {'shutdown':>9}")  # fmt: skip
    for workers in args.workers:
        row = _run_count(args, workers)
        rows.append(row)
        if "failed" in row:
            print(f"{workers:>8} failed: {row['failed']}", flush=True)
            continue
        rss = row["fork_server_rss_mib"]
        server = "-" if rss is None else f"{rss:.0f} MiB"
        line = (f"{workers:>8} {row['first_batch_s']:>10.2f} s {row['every_worker_s']:>11.2f} s "
                f"{row['worker_uss_mib_mean']:>9.1f} / {row['worker_uss_mib_max']:>5.1f} MiB "
                f"{row['worker_pss_mib_mean']:>5.1f} MiB {server:>11} {row['shutdown_s']:>7.2f} s")  # fmt: skip
        print(line, flush=True)
    if args.json:
        write_json(args.json, {"args": vars(args), "machine": machine, "rows": rows})


if __name__ == "__main__":
    main()
