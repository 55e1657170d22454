"""In-process collection speed, measured batch by batch: hand loop, RolloutEngine and Collector in turns.

``inprocess.py`` alternates whole rounds of ~100k frames; on a shared machine the speed of the
cores drifts between rounds (single rounds of the same loop range over 1.7x), which blurs ratios
of a few percent. Here the three contenders alternate *every batch* (hand loop, engine, collector,
hand loop, ...) in one process, so drift hits them alike, and each one's total time over all its
batches is compared. Both clocks are reported: wall time, and this process's CPU time.

* hand loop: the reference of ``inprocess.py`` (SyncVectorEnv in SAME_STEP mode, the MLP, ``copy_``
  into preallocated buffers);
* engine: ``acollect.rollout.RolloutEngine.collect`` called directly (the TorchRL layout, no thread);
* Collector: ``await anext(collector)`` (the engine in its collection thread, plus episode statistics).

Run ``python benchmarks/inprocess_paired.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import CategoricalMLPPolicy, machine_info, single_thread_torch, write_json
from inprocess import ENV_ID, TARGET_RATIO, HandLoop

from acollect import Collector, GymEnv
from acollect.devices import resolve_devices
from acollect.policy import wrap_policy
from acollect.rollout import RolloutEngine


async def measure(num_envs: int, frames_per_batch: int, batches: int) -> dict[str, dict[str, float]]:
    hand = HandLoop(num_envs, frames_per_batch, seed=0)
    env = GymEnv(ENV_ID, num_envs=num_envs)
    adapter = wrap_policy(CategoricalMLPPolicy(), observation_keys=env.observation_spec.leaf_keys(),
                          action_spec=env.action_spec, batch_size=env.batch_size)  # fmt: skip
    engine = RolloutEngine(env, adapter, frames_per_batch=frames_per_batch, devices=resolve_devices())
    totals = {name: {"wall": 0.0, "cpu": 0.0} for name in ("hand loop", "RolloutEngine", "acollect.Collector")}

    def add(name: str, wall: float, cpu: float) -> None:
        totals[name]["wall"] += time.perf_counter() - wall
        totals[name]["cpu"] += time.process_time() - cpu

    try:
        async with Collector(lambda: GymEnv(ENV_ID, num_envs=num_envs), CategoricalMLPPolicy(),
                             frames_per_batch=frames_per_batch) as collector:  # fmt: skip
            hand.collect_batch(), engine.collect(), await anext(collector)  # warm-up, untimed
            for _ in range(batches):
                wall, cpu = time.perf_counter(), time.process_time()
                hand.collect_batch()
                add("hand loop", wall, cpu)
                wall, cpu = time.perf_counter(), time.process_time()
                engine.collect()
                add("RolloutEngine", wall, cpu)
                wall, cpu = time.perf_counter(), time.process_time()
                await anext(collector)
                add("acollect.Collector", wall, cpu)
    finally:
        hand.close()
        engine.close()
    frames = batches * frames_per_batch
    return {name: {clock: frames / seconds for clock, seconds in t.items()} for name, t in totals.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--batches", type=int, default=60, help="timed batches per contender")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--frames-per-batch", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    single_thread_torch()
    rates = asyncio.run(measure(args.num_envs, args.frames_per_batch, args.batches))
    print(f"{ENV_ID}, {args.num_envs} envs, frames_per_batch={args.frames_per_batch}, "
          f"{args.batches} batches each, alternating batch by batch")  # fmt: skip
    print(f"{'what':<22}{'wall frames/s':>16}{'vs hand':>10}{'cpu frames/s':>16}{'vs hand':>10}")
    ref = rates["hand loop"]
    for name, r in rates.items():
        wall, cpu = r["wall"] / ref["wall"], r["cpu"] / ref["cpu"]
        print(f"{name:<22}{r['wall']:>16,.0f}{wall:>9.2f}x{r['cpu']:>16,.0f}{cpu:>9.2f}x")
    ratio = {clock: rates["acollect.Collector"][clock] / ref[clock] for clock in ("wall", "cpu")}
    verdict = "meets" if min(ratio.values()) >= TARGET_RATIO else "MISSES"
    print(f"\ncollector / hand loop = {ratio['wall']:.2f} (wall), {ratio['cpu']:.2f} (cpu): {verdict} {TARGET_RATIO}")
    payload = {"benchmark": "inprocess_paired", "env": ENV_ID, "args": {k: str(v) for k, v in vars(args).items()},
               "machine": machine_info(), "frames_per_s": rates, "collector_over_hand_loop": ratio}  # fmt: skip
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
