"""Launchers on one machine: the CartPole workload with workers as local processes, Ray actors, submitit jobs.

Every contender is a lockstep collector with 2 workers x 16 CartPole-v1 envs and the
reference MLP (4-64-64-2, categorical sampling), 2048 frames per batch, so the only
difference is where the workers run and the road their batches take:

* ``local ipc``: the default launcher, a private ipc socket (the reference: ratio 1.00);
* ``ray``: ``launcher="ray"``, each worker a Ray actor of a local 2-CPU cluster, batches over
  tcp to the node's address (what a RayCollector does);
* ``submitit``: ``launcher=SubmititLauncher(cluster="local")``, each worker a job of
  submitit's local executor, batches over tcp.

Frames/s count from the second batch on (the first pays for start-up, reported apart:
starting actors or jobs is where the launchers differ most). Ray's cluster is started once,
before the rounds, and not timed. Tcp loopback alone (no launcher) is in ``remote.py``.

Run: ``python benchmarks/scale.py [--rounds 3] [--frames 60000] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import CategoricalMLPPolicy, machine_info, run_interleaved, single_thread_torch, write_json

from acollect import MultiSyncCollector
from acollect.envs import GymEnv
from acollect.launchers import Launcher, LocalLauncher, RayLauncher, SubmititLauncher

WORKERS, ENVS, FPB = 2, 16, 2048


def _launcher(road: str) -> Launcher:
    if road == "local ipc":
        return LocalLauncher()
    if road == "ray":
        return RayLauncher()
    if road == "submitit":
        return SubmititLauncher(cluster="local")
    raise ValueError(road)


async def _round(road: str, frames: int) -> tuple[int, float, float]:
    n_batches = max(1, frames // FPB)
    created = time.perf_counter()
    collector = MultiSyncCollector(
        functools.partial(GymEnv, "CartPole-v1", num_envs=ENVS),
        CategoricalMLPPolicy(),
        num_workers=WORKERS,
        frames_per_batch=FPB,
        total_frames=(n_batches + 1) * FPB,
        launcher=_launcher(road),
    )
    async with collector:
        collected, first = 0, 0.0
        async for batch in collector:
            if not first:
                first = time.perf_counter()  # the first batch pays for start-up: not timed
                continue
            collected += batch.numel()
        seconds = time.perf_counter() - first
    return collected, seconds, first - created


def _available(road: str) -> str | None:
    """Why ``road`` cannot run here, or ``None``."""
    module = {"ray": "ray", "submitit": "submitit"}.get(road)
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed (pip install 'acollect[{module}]')"
    return None


ROADS = ("local ipc", "ray", "submitit")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=60_000, help="timed frames per round")
    parser.add_argument("--only", nargs="*", choices=ROADS, default=list(ROADS))
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    single_thread_torch()
    roads = [road for road in ROADS if road in args.only]
    if "ray" in roads and _available("ray") is None:
        import ray

        # On the main thread, before the rounds: a local cluster dies with the thread that started it.
        ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)

    def contender(road: str) -> Callable[[], tuple[int, float, float]] | str:
        why = _available(road)
        return why if why is not None else (lambda: asyncio.run(_round(road, args.frames)))

    results = run_interleaved([(road, contender(road)) for road in roads], args.rounds)
    base = results[0].median
    print(f"\n{'launcher':<12}{'frames/s':>12}{'vs ipc':>9}{'start-up s':>12}")
    out: dict[str, Any] = {}
    for r in results:
        if r.skipped:
            print(f"{r.name:<12}  skipped: {r.skipped}")
            out[r.name] = r.as_dict()
            continue
        print(f"{r.name:<12}{r.median:>12,.0f}{r.median / base:>9.2f}{statistics.median(r.startup_s):>12.1f}")
        out[r.name] = {**r.as_dict(), "ratio_to_ipc": r.median / base}
    payload = {"benchmark": "scale", "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_info(),
               "results": out}  # fmt: skip
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
