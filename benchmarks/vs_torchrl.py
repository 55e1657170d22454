"""acollect against TorchRL's collectors: the same env, policy, layout and frames per batch.

Run it in an environment where ``import torchrl`` works (torchrl pins its own tensordict; a
separate virtual environment with acollect installed is simplest). Where torchrl does not
import, the JSON says so and nothing is measured.

Contenders, in turns for ``--rounds`` rounds, each built afresh with one untimed warm-up batch:

* in-process: acollect ``Collector`` over ``GymEnv("CartPole-v1", num_envs=8)``, and torchrl's
  ``Collector`` over ``SerialEnv(8, GymEnv("CartPole-v1"))`` (torchrl's ``GymEnv(num_envs=8)``
  steps its sub-envs in processes of their own, and is slower still on a small machine);
* worker processes: acollect ``MultiSyncCollector`` with 2 workers x ``GymEnv(..., num_envs=16)``,
  and torchrl's ``MultiSyncCollector`` with 2 workers x ``SerialEnv(16, GymEnv(...))``.

Every contender gets the same module object type, the MLP in a ``TensorDictModule`` reading
``"observation"`` and writing ``"action"`` (categorical actions as int64 indices), and 2048 frames
per batch. TorchRL collects about ten times fewer frames per second, so it times
``--torchrl-frames`` frames per round against ``--frames`` for acollect; the rates compare.

    /path/to/torchrl-env/bin/python benchmarks/vs_torchrl.py --json docs/data/vs-torchrl.json

Run ``python benchmarks/vs_torchrl.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, machine_info, make_policy, median, single_thread_torch, write_json

from acollect import Collector, GymEnv, MultiSyncCollector

GOAL = 20.0
PAIRS = [("acollect Collector (8 envs)", "torchrl Collector, SerialEnv(8)"),
         ("acollect MultiSyncCollector (2 x 16)", "torchrl MultiSyncCollector (2 x SerialEnv(16))")]  # fmt: skip


def _timed(batches: Iterator[Any], frames: int) -> tuple[int, float]:
    next(batches)  # warm-up, untimed
    start, collected = time.perf_counter(), 0
    while collected < frames:
        collected += next(batches).numel()
    return collected, time.perf_counter() - start


async def _acollect(frames: int, fpb: int, sync: bool) -> tuple[int, float]:
    policy = make_policy()
    if sync:
        collector: Any = MultiSyncCollector(functools.partial(GymEnv, ENV_ID, num_envs=16), policy, num_workers=2,
                                            frames_per_batch=fpb, total_frames=-1)  # fmt: skip
    else:
        collector = Collector(functools.partial(GymEnv, ENV_ID, num_envs=8), policy, frames_per_batch=fpb,
                              total_frames=-1)  # fmt: skip
    async with collector:
        await anext(collector)  # warm-up, untimed
        start, collected = time.perf_counter(), 0
        while collected < frames:
            collected += (await anext(collector)).numel()
        return collected, time.perf_counter() - start


def _torchrl(frames: int, fpb: int, sync: bool) -> tuple[int, float]:
    import torchrl.collectors as trc
    from torchrl.envs import GymEnv as TorchRLGymEnv
    from torchrl.envs import SerialEnv

    make_env = functools.partial(TorchRLGymEnv, ENV_ID, categorical_action_encoding=True)
    # torchrl is only measured here: its deprecation notices are not this benchmark's business.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if sync:
            envs = [functools.partial(SerialEnv, 16, make_env)] * 2
            collector = trc.MultiSyncCollector(envs, make_policy(), frames_per_batch=fpb, total_frames=-1)
        else:
            collector = trc.Collector(SerialEnv(8, make_env), make_policy(), frames_per_batch=fpb, total_frames=-1)
        try:
            return _timed(iter(collector), frames)
        finally:
            collector.shutdown()


def torchrl_missing() -> str | None:
    """Why torchrl cannot be measured here, or ``None``."""
    try:
        import torchrl  # noqa: F401
    except Exception as exc:  # any import failure means "no torchrl figures here"
        return f"torchrl not importable ({type(exc).__name__}: {exc})"
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=61_440, help="timed acollect frames per round")
    parser.add_argument("--torchrl-frames", type=int, default=10_240, help="timed torchrl frames per round")
    parser.add_argument("--frames-per-batch", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    single_thread_torch()
    payload: dict[str, Any] = {"benchmark": "vs_torchrl", "env": ENV_ID,
                               "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_info(),
                               "goal": GOAL}  # fmt: skip
    missing = torchrl_missing()
    if missing is not None:
        print(f"skipped: {missing}")
        payload["skipped"] = missing
    else:
        import torchrl

        payload["machine"]["torchrl"] = torchrl.__version__
        fpb = args.frames_per_batch
        runs: dict[str, Callable[[], tuple[int, float]]] = {
            PAIRS[0][0]: lambda: asyncio.run(_acollect(args.frames, fpb, sync=False)),
            PAIRS[0][1]: lambda: _torchrl(args.torchrl_frames, fpb, sync=False),
            PAIRS[1][0]: lambda: asyncio.run(_acollect(args.frames, fpb, sync=True)),
            PAIRS[1][1]: lambda: _torchrl(args.torchrl_frames, fpb, sync=True),
        }
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(args.rounds):
            for name, run in runs.items():
                frames, seconds = run()
                rates[name].append(frames / seconds)
                print(f"round {r + 1}/{args.rounds} {name:<48} {rates[name][-1]:>10,.0f} frames/s", flush=True)
        medians = {name: median(v) for name, v in rates.items()}
        ratios = {ours: medians[ours] / medians[theirs] for ours, theirs in PAIRS}
        print()
        for ours, theirs in PAIRS:
            print(f"{ours} / {theirs} = {ratios[ours]:.1f}x (goal >= {GOAL:g}x)")
        payload.update(frames_per_s=rates, median_frames_per_s=medians, ratio_to_torchrl=ratios)
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
