"""Central inference against TorchRL: acollect's ``AsyncBatchedCollector`` and torchrl's, 16 CartPole envs each.

Run it in an environment where ``import torchrl`` works (see ``vs_torchrl.py``); where torchrl does not import,
the JSON says so and nothing is measured.

Contenders, every one started once (start-up untimed, and timed apart), then in turns, the order rotating each
round; each turn first takes untimed what the contender collected ahead while the others had their turns, then
times ``--acollect-batches`` or ``--torchrl-batches`` batches. TorchRL collects far fewer frames per second, so
its turns hold fewer frames; the rates compare.

* acollect: ``AsyncBatchedCollector("CartPole-v1", policy, num_workers=2, env_kwargs={"num_envs": 8})``, its
  defaults (the inference server in a process of its own), batches of one worker's ``[8, 64]``;
* torchrl 0.14.1's ``AsyncBatchedCollector([make_env] * 16, ...)`` over ``GymEnv("CartPole-v1")``, 1024 frames per
  batch (64 steps of each env), in the configurations ``--torchrl`` names:

  - ``threads``: its defaults (each env stepped by a thread of this process, the policy served by a thread);
  - ``processes``: ``env_backend="multiprocessing"`` (16 env processes, the policy served by a thread);
  - ``processes-2x8``: ``env_backend="multiprocessing", envs_per_worker=8`` (acollect's layout: 2 processes of
    8 envs);
  - ``server-process``: ``env_backend="multiprocessing", transport="auto"`` with a ``policy_factory`` (16 env
    processes talking to an inference process through its shared-memory slots, 64-step chunks to the driver):
    the configuration its docs give as the fast one for process-backed envs, the default in torchrl 0.15.

Every contender runs the same policy (benchmarks/_common.py: the 4-64-64-2 MLP sampling a categorical action, in a
``TensorDictModule``), one torch thread per process. Two clocks: wall time, and the CPU time of this process and the
contender's own child processes (this process's idle threads of the other contenders count too: a small bias
against the measured one). Before each turn the run waits, untimed, until every contender has stopped collecting
ahead (torchrl's refill their result queues after their turns, which took most of a core from the next turn
otherwise); the cores the waiting contenders' processes still take during each turn are reported.

    /path/to/torchrl-env/bin/python benchmarks/vs_torchrl_central.py --json docs/data/vs-torchrl-central.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import psutil
from _common import (
    ENV_ID,
    Turns,
    cpu_of,
    machine_info,
    make_policy,
    median,
    settle,
    single_thread_torch,
    write_json,
)
from vs_torchrl import torchrl_missing

from acollect import AsyncBatchedCollector

GOAL = 20.0
WORKERS, ENVS_PER_WORKER, STEPS = 2, 8, 64
ENVS = WORKERS * ENVS_PER_WORKER
CREDITS = 2
ACOLLECT = "acollect AsyncBatchedCollector (2 x 8)"
TORCHRL_CONFIGS: dict[str, dict[str, Any]] = {
    "threads": {},
    "processes": {"env_backend": "multiprocessing"},
    "processes-2x8": {"env_backend": "multiprocessing", "envs_per_worker": ENVS_PER_WORKER},
    "server-process": {"env_backend": "multiprocessing", "transport": "auto"},
}


def torchrl_name(config: str) -> str:
    return f"torchrl AsyncBatchedCollector ({config})"


SHORT = {ACOLLECT: "acollect", **{torchrl_name(config): f"torchrl {config}" for config in TORCHRL_CONFIGS}}


def make_torchrl_env() -> Any:
    """torchrl's CartPole, actions as int64 indices like acollect's (module level: its worker processes pickle it)."""
    from torchrl.envs import GymEnv as TorchRLGymEnv

    return TorchRLGymEnv(ENV_ID, categorical_action_encoding=True)


def make_acollect() -> AsyncBatchedCollector:
    """acollect's contender, its defaults but for the workers' start method (as in central_inference.py)."""
    return AsyncBatchedCollector(ENV_ID, make_policy(), num_workers=WORKERS, env_kwargs={"num_envs": ENVS_PER_WORKER},
                                 frames_per_batch=ENVS_PER_WORKER * STEPS, total_frames=-1, credits=CREDITS,
                                 start_method="forkserver")  # fmt: skip


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


class TorchRLContender:
    """One of torchrl's collectors, built, iterated and shut down in one thread of its own (see :func:`measure`)."""

    def __init__(self, config: str) -> None:
        self.name = torchrl_name(config)
        self.config = config
        self.batches: Iterator[Any] | None = None
        self.collector: Any = None
        self.pids: list[int] = []

    def start(self, warmup: int) -> float:
        """Builds the collector and takes ``warmup`` batches: the start-up seconds."""
        from torchrl.collectors import AsyncBatchedCollector as TorchRLAsyncBatchedCollector

        options = dict(TORCHRL_CONFIGS[self.config])
        # The server process rebuilds the policy from a factory; the others are given the module, as a user would.
        policy: dict[str, Any] = (
            {"policy_factory": make_policy} if options.get("transport") == "auto" else {"policy": make_policy()}
        )
        before, started = _children(), time.perf_counter()
        # torchrl is only measured here: its notices about defaults changing in 0.15 are not this benchmark's business.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.collector = TorchRLAsyncBatchedCollector(
                [make_torchrl_env] * ENVS, frames_per_batch=ENVS * STEPS, total_frames=-1, **policy, **options
            )
            self.batches = iter(self.collector)
            for _ in range(warmup):
                next(self.batches)
        self.pids = sorted(_children() - before)
        return time.perf_counter() - started

    def turn(self, ahead: int, batches: int) -> tuple[int, float, float]:
        """``ahead`` untimed batches (collected while the others had their turns), then ``batches`` timed ones."""
        assert self.batches is not None
        for _ in range(ahead):
            next(self.batches)
        cpu, children_cpu, wall = time.process_time(), cpu_of(self.pids), time.perf_counter()
        frames = sum(next(self.batches).numel() for _ in range(batches))
        return frames, time.perf_counter() - wall, time.process_time() - cpu + cpu_of(self.pids) - children_cpu

    def shutdown(self) -> None:
        if self.batches is not None:
            self.batches.close()  # torchrl's iterator shuts its collector down when closed (not later, at exit)
        if self.collector is not None:
            self.collector.shutdown()


async def _acollect_turn(collector: Any, pids: list[int], batches: int) -> tuple[int, float, float]:
    for _ in range(WORKERS * CREDITS):
        await anext(collector)  # collected ahead while the others had their turns
    cpu, children_cpu, wall = time.process_time(), cpu_of(pids), time.perf_counter()
    frames = 0
    for _ in range(batches):
        frames += (await anext(collector)).numel()
    return frames, time.perf_counter() - wall, time.process_time() - cpu + cpu_of(pids) - children_cpu


async def measure(args: argparse.Namespace) -> tuple[Turns, dict[str, float], dict[str, Any], dict[str, list[float]]]:
    """Every contender started once, then ``args.rounds`` rounds of turns: the turns, start-ups, acollect's server
    stats, and the cores the waiting contenders' processes used during each turn."""
    loop = asyncio.get_running_loop()
    # torchrl's collectors are iterated synchronously: in a thread, so that acollect's event loop (its workers'
    # heartbeats) keeps running during torchrl's turns. One thread for all, so each collector lives in one thread.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchrl")
    torchrl = [TorchRLContender(config) for config in args.torchrl]
    startup: dict[str, float] = {}
    turns = Turns()
    waiting: dict[str, list[float]] = {ACOLLECT: [], **{contender.name: [] for contender in torchrl}}
    try:
        async with AsyncExitStack() as stack:
            before, started = _children(), time.perf_counter()
            collector = await stack.enter_async_context(make_acollect())
            for _ in range(2 * WORKERS):
                await anext(collector)  # every worker started and warm
            startup[ACOLLECT] = time.perf_counter() - started
            pids = sorted(_children() - before)
            print(f"started {ACOLLECT} in {startup[ACOLLECT]:.1f} s", flush=True)
            for contender in torchrl:
                startup[contender.name] = await loop.run_in_executor(pool, contender.start, 2)
                print(f"started {contender.name} in {startup[contender.name]:.1f} s", flush=True)

            async def run_acollect() -> tuple[int, float, float]:
                return await _acollect_turn(collector, pids, args.acollect_batches)

            def torchrl_turn(contender: TorchRLContender) -> Callable[[], Any]:
                return lambda: loop.run_in_executor(pool, contender.turn, args.ahead, args.torchrl_batches)

            runs: list[tuple[str, Callable[[], Any]]] = [(ACOLLECT, run_acollect)]
            runs += [(contender.name, torchrl_turn(contender)) for contender in torchrl]
            pids_of = {ACOLLECT: pids, **{contender.name: contender.pids for contender in torchrl}}
            all_pids = [pid for contender_pids in pids_of.values() for pid in contender_pids]
            for index in range(args.rounds):
                shift = index % len(runs)
                line = []
                for name, run in runs[shift:] + runs[:shift]:
                    await settle(all_pids)
                    # What the waiting contenders' processes take meanwhile (they poll): CPU the turn cannot have.
                    others = [pid for other, other_pids in pids_of.items() if other != name for pid in other_pids]
                    others_cpu, started = cpu_of(others), time.perf_counter()
                    frames, wall, cpu = await run()
                    waiting[name].append((cpu_of(others) - others_cpu) / (time.perf_counter() - started))
                    turns.add(name, frames, wall, cpu)
                    line.append(f"{SHORT.get(name, name)} {frames / wall:,.0f}")
                print(f"round {index + 1}/{args.rounds}: " + ", ".join(line) + " frames/s", flush=True)
            server = collector.stats().inference
    finally:
        for contender in torchrl:
            await loop.run_in_executor(pool, contender.shutdown)
        pool.shutdown()
    return turns, startup, server, waiting


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="turns of each contender (the order rotating)")
    parser.add_argument("--acollect-batches", type=int, default=128, help="timed acollect batches (512 frames) a turn")
    parser.add_argument("--torchrl-batches", type=int, default=6, help="timed torchrl batches (1024 frames) a turn")
    ahead_help = "untimed torchrl batches at the start of each turn (what it collected ahead)"
    parser.add_argument("--ahead", type=int, default=2, help=ahead_help)
    configs_help = f"torchrl configurations, comma-separated, of {list(TORCHRL_CONFIGS)}"
    parser.add_argument("--torchrl", default=",".join(TORCHRL_CONFIGS), help=configs_help)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    args.torchrl = [config.strip() for config in args.torchrl.split(",") if config.strip()]
    if not args.torchrl or any(config not in TORCHRL_CONFIGS for config in args.torchrl):
        parser.error(f"--torchrl: a comma-separated list of {list(TORCHRL_CONFIGS)}, got {args.torchrl}")
    single_thread_torch()
    payload: dict[str, Any] = {"benchmark": "vs_torchrl_central", "env": ENV_ID,
                               "args": {k: v if k == "torchrl" else str(v) for k, v in vars(args).items()},
                               "machine": machine_info(), "goal": GOAL,
                               "torchrl_configs": {c: TORCHRL_CONFIGS[c] for c in args.torchrl}}  # fmt: skip
    missing = torchrl_missing()
    if missing is not None:
        print(f"skipped: {missing}")
        payload["skipped"] = missing
    else:
        import torchrl

        payload["machine"]["torchrl"] = torchrl.__version__
        turns, startup, server, waiting = asyncio.run(measure(args))
        rates = turns.rates()
        print()
        for name, rate in rates.items():
            print(f"{name:<58} {rate['wall']:>9,.0f} frames/s wall {rate['cpu']:>9,.0f} frames per CPU-s"
                  f"  (start-up {startup[name]:.1f} s; others waiting: {median(waiting[name]):.2f} cores)")  # fmt: skip
        ratios = {}
        print()
        for config in args.torchrl:
            name = torchrl_name(config)
            per_round = [a / t for a, t in zip(turns.turn_rates(ACOLLECT), turns.turn_rates(name), strict=True)]
            ratios[name] = {
                "wall": rates[ACOLLECT]["wall"] / rates[name]["wall"],
                "cpu": rates[ACOLLECT]["cpu"] / rates[name]["cpu"],
                "median_of_rounds": median(per_round),
                "rounds": per_round,
            }
            verdict = "met" if ratios[name]["wall"] >= GOAL else "missed"
            print(f"acollect / {name}: {ratios[name]['wall']:.1f}x wall (rounds {min(per_round):.1f}-"
                  f"{max(per_round):.1f}x), {ratios[name]['cpu']:.1f}x CPU; goal >= {GOAL:g}x: {verdict}")  # fmt: skip
        payload.update(turns=turns.as_dict(), ratios=ratios, startup_s=startup, acollect_server=server,
                       waiting_contenders_cores=waiting)  # fmt: skip
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
