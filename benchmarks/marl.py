"""A multi-agent batch through ``MultiSyncCollector`` against the same envs stepped in a hand loop.

The env is VMAS ``navigation`` (3 agents, continuous actions) through TorchRL's ``VmasEnv``, ``--num-envs``
vectorised copies in one torch env. The reference is the loop a user writes with TorchRL alone:
``env.rollout(T, break_when_any_done=False)`` with random actions, one ``[E, T]`` batch a call. Against it,
``MultiSyncCollector`` with one worker process building the same env, random actions, the same frames per batch.

The contenders take turns in phases (loop, collector, collector, loop, ...), each a fresh run of ``--batches``
batches after one warm-up batch, so the worker's process never steps beside the loop and drift in the machine's
speed hits both alike. Torch runs one thread in each process. Reported: frames/s of each, and their ratio.

Run ``python benchmarks/marl.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import machine_info, write_json

from acollect import MultiSyncCollector

warnings.filterwarnings("ignore", category=UserWarning)  # VMAS and TorchRL version notices


def make_env(num_envs: int, n_agents: int) -> Any:
    from torchrl.envs.libs.vmas import VmasEnv

    torch.set_num_threads(1)
    return VmasEnv("navigation", num_envs=num_envs, n_agents=n_agents, seed=0)


def hand_loop(args: argparse.Namespace) -> float:
    """Frames/s of ``env.rollout`` over ``--batches`` batches, after one."""
    env = make_env(args.num_envs, args.agents)
    steps = args.frames_per_batch // args.num_envs
    env.rollout(steps, break_when_any_done=False)
    start = time.perf_counter()
    for _ in range(args.batches):
        env.rollout(steps, break_when_any_done=False)
    elapsed = time.perf_counter() - start
    env.close()
    return args.batches * args.frames_per_batch / elapsed


async def collector(args: argparse.Namespace) -> float:
    """Frames/s of a one-worker ``MultiSyncCollector`` over ``--batches`` batches, after one."""
    env = functools.partial(make_env, args.num_envs, args.agents)
    async with MultiSyncCollector([env], None, frames_per_batch=args.frames_per_batch, num_threads=1) as c:
        await anext(c)
        start = time.perf_counter()
        for _ in range(args.batches):
            await anext(c)
        elapsed = time.perf_counter() - start
    return args.batches * args.frames_per_batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=32, help="vectorised VMAS envs (default 32)")
    parser.add_argument("--agents", type=int, default=3, help="agents per env (default 3)")
    parser.add_argument("--frames-per-batch", type=int, default=32 * 100, help="frames a batch (default 3200)")
    parser.add_argument("--batches", type=int, default=10, help="batches timed per phase (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of loop, collector, collector, loop")
    parser.add_argument("--json", type=Path, default=None, help="write the figures there")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop: list[float] = []
    ours: list[float] = []
    for _ in range(args.rounds):
        loop.append(hand_loop(args))
        ours.append(asyncio.run(collector(args)))
        ours.append(asyncio.run(collector(args)))
        loop.append(hand_loop(args))
    ratios = [o / r for o, r in zip(ours, loop, strict=True)]
    print(f"VMAS navigation, {args.agents} agents, {args.num_envs} envs, {args.frames_per_batch} frames a batch")
    print(f"hand loop (env.rollout):   {statistics.median(loop):10,.0f} frames/s  {[round(x) for x in loop]}")
    print(f"MultiSyncCollector (1 w.): {statistics.median(ours):10,.0f} frames/s  {[round(x) for x in ours]}")
    per_phase = [round(r, 3) for r in ratios]
    print(f"ratio (collector / loop):  {statistics.median(ratios):.3f} median, per phase {per_phase}")
    if args.json is not None:
        write_json(args.json, {"loop": loop, "collector": ours, "ratios": ratios, "machine": machine_info(),
                               "args": {k: str(v) for k, v in vars(args).items()}})  # fmt: skip


if __name__ == "__main__":
    main()
