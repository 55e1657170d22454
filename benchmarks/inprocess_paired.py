"""In-process collection against the loop a user writes instead, alternating batch by batch.

The reference is :class:`~acollect.cli.reference_loops.CleanRLLoop`, cleanrl style:
``gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")`` with gymnasium's default
(NEXT_STEP) autoreset, the 4-64-64-2 MLP in a ``TensorDictModule``, observations, actions,
rewards and dones copied into preallocated ``[E, T]`` buffers and cloned per batch. Against it,
with the same policy module object and the same frames per batch:

* ``Collector(lambda: GymEnv("CartPole-v1", num_envs=8))``: acollect builds the vector env;
* ``Collector(lambda: GymEnv(gym.make_vec(..., vectorization_mode="sync")))``: the user's own
  default-autoreset vector env, which acollect wraps as it is (finished sub-envs are reset at
  once, so no transition that did not happen is handed out).

The contenders take turns *every batch* (loop, collector, collector, loop, ...) in one process, so
drift in the machine's speed hits them alike; each one's total over its batches is compared on
two clocks: wall time, and this process's CPU time (all threads), which other jobs disturb less.
The pairing holds because a ``Collector`` collects only when asked for a batch.

Run ``python benchmarks/inprocess_paired.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, CleanRLLoop, Turns, machine_info, make_policy, single_thread_torch, write_json

from acollect import Collector, GymEnv

REFERENCE = "hand loop (make_vec sync, default autoreset)"
GOAL = 0.95


def contenders(num_envs: int) -> dict[str, Any]:
    """Collector rows: name -> env factory."""
    return {
        f"Collector(GymEnv(id, num_envs={num_envs}))": lambda: GymEnv(ENV_ID, num_envs=num_envs),
        "Collector(GymEnv(gym.make_vec(...)))": lambda: GymEnv(
            gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="sync")
        ),
    }


async def measure(args: argparse.Namespace) -> Turns:
    policy = make_policy()  # one module object for every contender
    hand = CleanRLLoop(args.num_envs, args.frames_per_batch, policy=policy, seed=0)
    turns = Turns()
    try:
        async with AsyncExitStack() as stack:
            collectors = {
                name: await stack.enter_async_context(
                    Collector(make_env, policy, frames_per_batch=args.frames_per_batch, total_frames=-1)
                )
                for name, make_env in contenders(args.num_envs).items()
            }
            for _ in range(args.warmup):  # untimed: first calls, thread start-up, allocations
                hand.collect_batch()
                for collector in collectors.values():
                    await anext(collector)

            async def hand_batch() -> int:
                return hand.collect_batch()

            def collector_batch(collector: Collector) -> Callable[[], Awaitable[int]]:
                async def take() -> int:
                    return (await anext(collector)).numel()

                return take

            order = [(REFERENCE, hand_batch)] + [(name, collector_batch(c)) for name, c in collectors.items()]
            for index in range(args.batches):
                # The order rotates too, so no contender always runs right after the same other one.
                shift = index % len(order)
                for name, take in order[shift:] + order[:shift]:
                    started = turns.start()
                    frames = await take()
                    turns.stop(name, frames, started)
    finally:
        hand.close()
    return turns


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--batches", type=int, default=60, help="timed batches per contender")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per contender first")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--frames-per-batch", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.frames_per_batch % args.num_envs:
        parser.error(f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-envs")
    single_thread_torch()
    machine = machine_info()
    turns = asyncio.run(measure(args))
    rates = turns.rates()
    print(f"{ENV_ID}, {args.num_envs} envs, frames_per_batch={args.frames_per_batch}, "
          f"{args.batches} batches each, alternating batch by batch")  # fmt: skip
    print(f"{'what':<46}{'wall frames/s':>15}{'vs ref':>8}{'cpu frames/s':>15}{'vs ref':>8}")
    ref = rates[REFERENCE]
    ratios = {}
    for name, r in rates.items():
        ratios[name] = {clock: r[clock] / ref[clock] for clock in ("wall", "cpu")}
        print(
            f"{name:<46}{r['wall']:>15,.0f}{ratios[name]['wall']:>7.2f}x{r['cpu']:>15,.0f}{ratios[name]['cpu']:>7.2f}x"
        )
    print(f"goal: >= {GOAL}x on both clocks")
    payload = {
        "benchmark": "inprocess_paired",
        "env": ENV_ID,
        "reference": REFERENCE,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine,
        "turns": turns.as_dict(),
        "ratio_to_reference": {name: r for name, r in ratios.items() if name != REFERENCE},
        "goal": GOAL,
    }
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
