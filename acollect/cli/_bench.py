"""``acollect bench``: how fast acollect collects on this machine, against hand-written loops.

Two workloads, each timed after one untimed warm-up batch, contenders in turns:

* ``cartpole``: CartPole-v1 driven by a 4-64-64-2 Tanh MLP sampling a categorical action
  (in a ``TensorDictModule``), one torch thread. The in-process reference is the loop a user
  writes instead (:class:`~acollect.cli._reference_loops.CleanRLLoop`: a default-autoreset
  ``gymnasium.make_vec`` sync env filling ``[n_envs, T]`` buffers cloned per batch). The
  reference for worker processes is their **ceiling**: as many such loops in as many
  processes, started together with no communication, timed after a barrier (start-up
  excluded). Then ``Collector`` with the same total env count, ``MultiSyncCollector`` and
  ``MultiAsyncCollector`` with the workers' split, and TorchRL's collectors when torchrl is
  installed.
* ``pixels``: a synthetic env of 84x84x4 uint8 observations with no step cost, so only
  moving data is measured. The reference is an in-process loop copying the same
  observations into preallocated buffers.

The defaults take about a minute; pass ``--frames`` and ``--rounds`` for steadier figures.
Compare figures only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

# torch, gymnasium and acollect's collectors are imported where a workload runs, never at the top:
# `acollect bench --help` (and `acollect --help`, which imports every command module) must not load them.

__all__ = ["Result", "add_parser", "run"]

PIXEL_SHAPE = (84, 84, 4)
# A round returns (frames collected in its timed part, seconds they took).
#: one round of a contender: (frames, seconds), or (frames, seconds, what bounded it: a collector's bottleneck)
Round = Callable[[], tuple[int, float] | tuple[int, float, str | None]]


# -- the workloads -------------------------------------------------------------------------
class PixelHandLoop:
    """The pixels reference: the same observations written into preallocated ``[E, T]`` buffers, in-process."""

    def __init__(self, num_envs: int, frames_per_batch: int) -> None:
        import torch

        self.steps = frames_per_batch // num_envs
        self.obs = torch.zeros(num_envs, *PIXEL_SHAPE, dtype=torch.uint8)
        self.observation = torch.empty(num_envs, self.steps, *PIXEL_SHAPE, dtype=torch.uint8)
        self.next_observation = torch.empty_like(self.observation)
        self._t = 0

    def collect_batch(self) -> int:
        for t in range(self.steps):
            self.observation[:, t].copy_(self.obs)
            self._t += 1
            self.obs.fill_(self._t % 251)
            self.next_observation[:, t].copy_(self.obs)
        return self.steps * self.obs.shape[0]

    def close(self) -> None:
        pass


# -- rounds ------------------------------------------------------------------------------------
def _loop_round(make: Callable[[], Any], frames: int, frames_per_batch: int) -> tuple[int, float]:
    loop = make()
    try:
        loop.collect_batch()  # warm-up, untimed
        n_batches = max(1, frames // frames_per_batch)
        start = time.perf_counter()
        collected = sum(loop.collect_batch() for _ in range(n_batches))
        return collected, time.perf_counter() - start
    finally:
        loop.close()


async def _collector_round(
    make: Callable[[int], Any], frames: int, frames_per_batch: int, *, warmup: int = 1
) -> tuple[int, float, str | None]:
    n_batches = max(1, frames // frames_per_batch)
    async with make((n_batches + warmup) * frames_per_batch) as collector:
        collected, seen, start = 0, 0, 0.0
        async for batch in collector:
            seen += 1
            if seen <= warmup:  # start-up is not collection
                start = time.perf_counter()
                continue
            collected += batch.numel()
        return collected, time.perf_counter() - start, collector.stats().bottleneck


def _ceiling_round(workers: int, envs_per_worker: int, frames: int, frames_per_batch: int) -> tuple[int, float]:
    """``workers`` independent loop processes; the seconds returned make frames/s the sum of theirs."""
    from acollect.cli._reference_loops import run_independent_loops

    loops = run_independent_loops(
        workers, envs_per_worker, frames_per_batch // workers, max(1, frames // frames_per_batch), timeout=600.0
    )
    return loops.frames, loops.frames / loops.frames_per_s


def _torchrl_round(num_envs: int, workers: int, frames: int, frames_per_batch: int) -> tuple[int, float]:
    import torchrl.collectors as trc
    from torchrl.envs import GymEnv as TorchRLGymEnv
    from torchrl.envs import SerialEnv

    from acollect.cli._reference_loops import ENV_ID, make_policy

    n_batches = max(1, frames // frames_per_batch)
    policy = make_policy()
    make_env = partial(TorchRLGymEnv, ENV_ID, categorical_action_encoding=True)
    total = (n_batches + 1) * frames_per_batch
    collected, start = 0, None
    # torchrl is only measured here: its deprecation notices are not the reader's business.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if workers == 1:
            cls = getattr(trc, "Collector", None) or trc.SyncDataCollector
            env = SerialEnv(num_envs, make_env)
            collector = cls(env, policy, frames_per_batch=frames_per_batch, total_frames=total)
        else:
            cls = getattr(trc, "MultiSyncCollector", None) or trc.MultiSyncDataCollector
            envs = [partial(SerialEnv, num_envs // workers, make_env)] * workers
            collector = cls(envs, policy, frames_per_batch=frames_per_batch, total_frames=total)
        try:
            for batch in collector:
                if start is None:
                    start = time.perf_counter()
                    continue
                collected += batch.numel()
        finally:
            collector.shutdown()
    assert start is not None
    return collected, time.perf_counter() - start


# -- measuring and reporting -------------------------------------------------------------------
@dataclass
class Result:
    """Frames/s of one contender over its rounds, or why it did not run."""

    name: str
    frames_per_s: list[float] = field(default_factory=list)
    skipped: str | None = None
    #: what bounded a collector in its last round (``CollectorStats.bottleneck``), ``None`` for the references
    bottleneck: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.frames_per_s) if self.frames_per_s else None


def _measure(contenders: list[tuple[str, Round | str]], rounds: int, log: Callable[[str], None]) -> list[Result]:
    """Runs the contenders in turns so that drifting machine load hits them alike."""
    results = [Result(name, skipped=run if isinstance(run, str) else None) for name, run in contenders]
    for r in range(rounds):
        for result, (name, run) in zip(results, contenders, strict=True):
            if isinstance(run, str) or result.skipped:
                continue
            log(f"  {name}: round {r + 1}/{rounds}")
            try:
                frames, seconds, *bound = run()
            except Exception as exc:
                if not name.startswith("torchrl"):
                    raise
                # torchrl is only a point of comparison: its failure must not cost the user acollect's figures.
                result.skipped = f"failed: {type(exc).__name__}: {exc}"
                continue
            result.frames_per_s.append(frames / seconds)
            result.bottleneck = bound[0] if bound else None
    return results


def format_table(
    results: list[Result],
    *,
    bytes_per_frame: int | None = None,
    ceiling: str | None = None,
    worker_rows: frozenset[str] = frozenset(),
) -> str:
    """Median frames/s per contender, its ratio to the first one (the hand loop), and worker rows' to ``ceiling``."""
    base = results[0].median
    top = next((r.median for r in results if r.name == ceiling), None)
    header = f"{'contender':<46} {'frames/s':>12} {'vs hand loop':>13}"
    if ceiling is not None:
        header += f" {'vs ceiling':>11}"
    if bytes_per_frame:
        header += f" {'GB/s':>7}"
    bounds = any(r.name.startswith("acollect") for r in results)  # collectors say what bounded them
    if bounds:
        header += "  bound by"
    lines = [header, "-" * len(header)]
    for r in results:
        if r.median is None:
            lines.append(f"{r.name:<46} {'skipped: ' + (r.skipped or 'not run')}")
            continue
        ratio = f"{r.median / base:.2f}x" if base else "-"
        line = f"{r.name:<46} {r.median:>12,.0f} {ratio:>13}"
        if ceiling is not None:
            line += f" {f'{r.median / top:.2f}x' if top and r.name in worker_rows else '':>11}"
        if bytes_per_frame:
            line += f" {r.median * bytes_per_frame / 1e9:>7.2f}"
        if bounds and r.name.startswith("acollect"):
            line += f"  {_BOUND_BY.get(r.bottleneck or '', '-')}"  # "-": too little measured to tell
        lines.append(line.rstrip())
    return "\n".join(lines)


#: a collector's bottleneck in words (docs/metrics.md, "Where the time goes")
_BOUND_BY = {
    "env": "env stepping",
    "policy": "the policy",
    "inference": "the inference server",
    "trainer": "the trainer",
    "cpu": "CPU contention",
    "trainer_cpu": "the trainer's CPU",
}


def _torchrl_missing() -> str | None:
    try:
        import torchrl  # noqa: F401
    except Exception as exc:  # any import failure means "no torchrl figures here"
        return f"torchrl not importable ({type(exc).__name__})"
    return None


def cartpole(args: argparse.Namespace, header: Callable[[str], None], log: Callable[[str], None]) -> dict[str, Any]:
    """The CartPole workload: hand loop, ceiling, Collector, MultiSync and MultiAsync (and torchrl's collectors).

    ``header`` gets the workload's title before measuring starts; ``log`` gets progress lines.
    """
    from acollect import Collector, MultiAsyncCollector, MultiSyncCollector
    from acollect.cli._reference_loops import ENV_ID, CleanRLLoop, make_policy
    from acollect.envs import GymEnv

    envs, workers, fpb, frames = args.num_envs, args.workers, args.frames_per_batch, args.frames
    per_worker = envs // workers

    def collector(total: int) -> Collector:
        return Collector(
            partial(GymEnv, ENV_ID, num_envs=envs), make_policy(), frames_per_batch=fpb, total_frames=total
        )

    def multi(cls: Any, batch: int) -> Callable[[int], Any]:
        return lambda total: cls(
            partial(GymEnv, ENV_ID, num_envs=per_worker),
            make_policy(),
            num_workers=workers,
            frames_per_batch=batch,
            total_frames=total,
        )

    split = f"{workers}x{per_worker} envs"
    ceiling = f"ceiling: {workers} independent hand loops ({split})"
    sync, async_ = f"acollect MultiSyncCollector ({split})", f"acollect MultiAsyncCollector ({split})"
    # MultiAsync batches come from one worker each: the size of a MultiSync batch's share, as in the ceiling.
    contenders: list[tuple[str, Round | str]] = [
        (f"hand loop, in-process ({envs} envs)", lambda: _loop_round(partial(CleanRLLoop, envs, fpb), frames, fpb)),
        (f"acollect Collector ({envs} envs)", lambda: asyncio.run(_collector_round(collector, frames, fpb))),
        (ceiling, lambda: _ceiling_round(workers, per_worker, frames, fpb)),
        (sync, lambda: asyncio.run(_collector_round(multi(MultiSyncCollector, fpb), frames, fpb))),
        (
            async_,
            lambda: asyncio.run(
                _collector_round(multi(MultiAsyncCollector, fpb // workers), frames, fpb // workers, warmup=workers)
            ),
        ),
    ]
    if not args.no_torchrl:
        missing = _torchrl_missing()
        contenders += [
            (f"torchrl Collector, SerialEnv({envs})", missing or (lambda: _torchrl_round(envs, 1, frames, fpb))),
            (
                f"torchrl MultiSyncCollector ({workers}x{per_worker})",
                missing or (lambda: _torchrl_round(envs, workers, frames, fpb)),
            ),
        ]
    title = f"{ENV_ID}, MLP 4-64-64-2, frames_per_batch {fpb}, {frames:,} timed frames x {args.rounds} round(s)"
    # Said under the table: a bare "vs ceiling" ratio does not tell what the collectors were held against.
    note = (
        f"vs ceiling: frames/s over the ceiling's, {workers} copies of the hand loop ({split}), each in its own "
        "process, started together and never communicating (no batch sent, no weight push, no trainer): what "
        f"{workers} worker processes collect when moving batches costs nothing. The collectors' worker processes "
        "run the same envs and policy."
    )
    header(title)
    results = _measure(contenders, args.rounds, log)
    return {
        "title": title,
        "results": results,
        "ceiling": ceiling,
        "worker_rows": frozenset({ceiling, sync, async_}),
        "note": note,
    }


def pixels(args: argparse.Namespace, header: Callable[[str], None], log: Callable[[str], None]) -> dict[str, Any]:
    """The pixels workload: hand loop, Collector, MultiSyncCollector on :class:`~acollect.testing.PixelEnv`."""
    from acollect import Collector, MultiSyncCollector
    from acollect.testing import PixelEnv

    envs, workers, frames = args.pixel_envs, args.workers, args.pixel_frames
    per_worker = envs // workers
    fpb = envs * args.pixel_steps

    def collector(total: int) -> Collector:
        return Collector(partial(PixelEnv, envs), frames_per_batch=fpb, total_frames=total)

    def multi(total: int) -> MultiSyncCollector:
        return MultiSyncCollector(
            partial(PixelEnv, per_worker), num_workers=workers, frames_per_batch=fpb, total_frames=total
        )

    contenders: list[tuple[str, Round | str]] = [
        (f"hand loop, in-process ({envs} envs)", lambda: _loop_round(partial(PixelHandLoop, envs, fpb), frames, fpb)),
        (f"acollect Collector ({envs} envs)", lambda: asyncio.run(_collector_round(collector, frames, fpb))),
        (
            f"acollect MultiSyncCollector ({workers}x{per_worker} envs)",
            lambda: asyncio.run(_collector_round(multi, frames, fpb)),
        ),
    ]
    shape = "x".join(map(str, PIXEL_SHAPE))
    title = (
        f"pixels {shape} uint8, no step cost, frames_per_batch {fpb}, {frames:,} timed frames x {args.rounds} round(s)"
    )
    header(title)
    results = _measure(contenders, args.rounds, log)
    # Observation and next observation: what a frame carries that matters.
    return {"title": title, "results": results, "bytes_per_frame": 2 * math.prod(PIXEL_SHAPE)}


WORKLOADS = {"cartpole": cartpole, "pixels": pixels}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``acollect bench``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="frames/s of acollect's collectors on this machine, against hand-written loops",
        description=(
            "Measures frames/s of acollect's Collector, MultiSyncCollector and MultiAsyncCollector on two workloads "
            "(CartPole-v1 with a small MLP, and 84x84x4 pixel observations with no step cost), against a "
            "hand-written in-process loop doing the same work; worker processes also against their ceiling, as "
            "many hand-written loops in independent processes; and torchrl's collectors when torchrl is "
            "installed. Short by default: raise --frames and --rounds for steadier figures."
        ),
    )
    parser.add_argument(
        "--only", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS), help="workloads to run (default: all)"
    )
    # Each number's default in its help, so `--help` says what a bare `acollect bench` runs.
    numbers = [
        ("--frames", 40_960, "timed CartPole frames per round: whole batches, at least one"),
        ("--rounds", 1, "rounds per contender, run in turns"),
        ("--frames-per-batch", 2048, "CartPole frames per batch"),
        ("--num-envs", 32, "CartPole envs in all, split among workers"),
        ("--workers", 2, "worker processes, and independent loop processes"),
        ("--pixel-frames", 8192, "timed pixel frames per round: whole batches, at least one"),
        ("--pixel-envs", 16, "pixel envs in all, split among workers"),
        ("--pixel-steps", 32, "steps per pixel batch, T"),
    ]
    for flag, default, text in numbers:
        parser.add_argument(flag, type=int, default=default, help=f"{text} (default: %(default)s)")
    parser.add_argument("--no-torchrl", action="store_true", help="skip torchrl's collectors even if installed")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    parser.set_defaults(run=run)
    return parser


def _check(args: argparse.Namespace) -> None:
    from acollect.errors import ConfigurationError

    for name in (
        "frames",
        "rounds",
        "frames_per_batch",
        "num_envs",
        "workers",
        "pixel_frames",
        "pixel_envs",
        "pixel_steps",
    ):
        if getattr(args, name) <= 0:
            raise ConfigurationError.bad_value(f"--{name.replace('_', '-')}", getattr(args, name), "a positive int")
    if args.num_envs % args.workers or args.pixel_envs % args.workers:
        raise ConfigurationError.bad_value(
            "--workers", args.workers, f"a divisor of --num-envs ({args.num_envs}) and --pixel-envs ({args.pixel_envs})"
        )
    if args.frames_per_batch % args.num_envs:
        raise ConfigurationError.bad_value(
            "--frames-per-batch", args.frames_per_batch, f"a multiple of --num-envs ({args.num_envs})"
        )
    # Rounds time whole batches: fewer frames than one batch would be measured as one batch, without a word.
    only = getattr(args, "only", WORKLOADS)
    if "cartpole" in only and args.frames < args.frames_per_batch:
        raise ConfigurationError.bad_value(
            "--frames",
            args.frames,
            f"at least one batch, --frames-per-batch ({args.frames_per_batch}): each round times whole batches",
        )
    pixel_batch = args.pixel_envs * args.pixel_steps
    if "pixels" in only and args.pixel_frames < pixel_batch:
        raise ConfigurationError.bad_value(
            "--pixel-frames",
            args.pixel_frames,
            f"at least one batch, --pixel-envs x --pixel-steps ({pixel_batch}): each round times whole batches",
        )


def _print_header(workload: str, title: str) -> None:
    # Once, on stdout, as measuring starts: above its table, and before the progress lines (on stderr).
    print(f"\n{workload}: {title}", flush=True)


def run(args: argparse.Namespace) -> int:
    """Runs the workloads and prints one table per workload."""
    import torch

    _check(args)
    torch.set_num_threads(1)  # as in every worker: the figures compare like with like

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    cores = os.cpu_count()
    print(
        f"acollect bench on {cores} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"1 torch thread"
    )
    report: dict[str, Any] = {
        "cores": cores,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "args": vars(args) | {"run": None},
        "workloads": {},
    }
    for name in args.only:
        outcome = WORKLOADS[name](args, partial(_print_header, name), log)
        results: list[Result] = outcome["results"]
        ceiling, worker_rows = outcome.get("ceiling"), outcome.get("worker_rows", frozenset())
        print(
            format_table(
                results, bytes_per_frame=outcome.get("bytes_per_frame"), ceiling=ceiling, worker_rows=worker_rows
            )
        )
        if outcome.get("note"):
            print(textwrap.fill(outcome["note"], width=100))
        base = results[0].median
        top = next((r.median for r in results if r.name == ceiling), None)
        report["workloads"][name] = {
            "title": outcome["title"],
            "note": outcome.get("note"),
            "bytes_per_frame": outcome.get("bytes_per_frame"),
            "results": [
                {
                    "name": r.name,
                    "frames_per_s": r.frames_per_s,
                    "median": r.median,
                    "skipped": r.skipped,
                    "vs_hand_loop": (r.median / base) if r.median and base else None,
                    "vs_ceiling": (r.median / top) if r.median and top and r.name in worker_rows else None,
                    "bottleneck": r.bottleneck,
                }
                for r in results
            ],
        }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"\nresults written to {args.json}")
    return 0
