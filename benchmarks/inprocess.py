"""In-process collection speed: acollect.Collector against a hand-written loop doing the same work.

The hand-written loop is the ceiling a collector can approach: a gymnasium ``SyncVectorEnv``
of CartPole-v1 (SAME_STEP autoreset), the reference MLP policy, one torch thread, and
preallocated ``[n_envs, T]`` buffers filled with ``copy_`` at each step. The collector gets
the same env count, the same policy module and the same ``frames_per_batch``.

Contenders run in turns (hand loop, collector, [torchrl], hand loop, ...) so changes in machine
load hit all of them alike; the table reports the median of the rounds. Each round builds its
envs afresh, collects one untimed warm-up batch, then times the rest.

Run ``python benchmarks/inprocess.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

# Runnable from a checkout: the shared helpers sit beside this file, acollect one level up.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (
    CategoricalMLPPolicy,
    format_table,
    machine_info,
    now,
    run_interleaved,
    set_clock,
    single_thread_torch,
    timed,
    write_json,
)

ENV_ID = "CartPole-v1"
TARGET_RATIO = 0.9


class HandLoop:
    """The hand-written reference: one vector env, one policy, preallocated ``[E, T]`` buffers."""

    def __init__(self, num_envs: int, frames_per_batch: int, *, seed: int) -> None:
        self.envs = gym.vector.SyncVectorEnv(
            [partial(gym.make, ENV_ID)] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP, copy=False
        )
        self.policy = CategoricalMLPPolicy()
        self.steps = frames_per_batch // num_envs
        obs, _ = self.envs.reset(seed=seed)
        self._obs = torch.from_numpy(obs)
        obs_dim = obs.shape[1]
        shape = (num_envs, self.steps)
        self.observation = torch.empty(*shape, obs_dim)
        self.action = torch.empty(shape, dtype=torch.int64)
        self.reward = torch.empty(*shape, 1)
        self.next_observation = torch.empty(*shape, obs_dim)
        self.done = torch.empty(*shape, 1, dtype=torch.bool)
        self.terminated = torch.empty(*shape, 1, dtype=torch.bool)
        self.truncated = torch.empty(*shape, 1, dtype=torch.bool)

    def collect_batch(self) -> int:
        """Fills the buffers with ``T`` steps of every env; returns the frame count."""
        envs, policy = self.envs, self.policy
        with torch.inference_mode():
            for t in range(self.steps):
                obs = self._obs
                self.observation[:, t].copy_(obs)
                action = policy(obs)
                self.action[:, t].copy_(action)
                next_obs, reward, terminated, truncated, info = envs.step(action.numpy())
                done = terminated | truncated
                self.reward[:, t, 0].copy_(torch.from_numpy(reward))
                self.terminated[:, t, 0].copy_(torch.from_numpy(terminated))
                self.truncated[:, t, 0].copy_(torch.from_numpy(truncated))
                self.done[:, t, 0].copy_(torch.from_numpy(done))
                next_t = torch.from_numpy(next_obs)
                self.next_observation[:, t].copy_(next_t)
                if done.any():
                    # SAME_STEP mode returns the reset observation for finished envs; the
                    # transition's true next observation is the final one.
                    final = info["final_obs"]
                    for i in np.flatnonzero(done):
                        self.next_observation[i, t].copy_(torch.from_numpy(final[i]))
                self._obs = next_t
        return self.steps * self.envs.num_envs

    def close(self) -> None:
        self.envs.close()


def hand_loop_round(num_envs: int, frames_per_batch: int, frames: int, seed: int) -> tuple[int, float, float]:
    start = now()
    loop = HandLoop(num_envs, frames_per_batch, seed=seed)
    try:
        loop.collect_batch()  # warm-up, untimed
        startup = now() - start
        n_batches = max(1, frames // frames_per_batch)
        collected, seconds = timed(lambda: sum(loop.collect_batch() for _ in range(n_batches)))
    finally:
        loop.close()
    return collected, seconds, startup


async def _collector_round(num_envs: int, frames_per_batch: int, frames: int) -> tuple[int, float, float]:
    from acollect import Collector, GymEnv

    n_batches = max(1, frames // frames_per_batch)
    policy = CategoricalMLPPolicy()
    created = now()
    collected = 0
    first_batch_at: float | None = None
    async with Collector(
        lambda: GymEnv(ENV_ID, num_envs=num_envs),
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=(n_batches + 1) * frames_per_batch,
    ) as collector:
        async for batch in collector:
            if first_batch_at is None:  # the warm-up batch, untimed
                first_batch_at = now()
                continue
            collected += batch.numel()
        finished = now()
    if first_batch_at is None:
        raise RuntimeError("the collector yielded no batch")
    return collected, finished - first_batch_at, first_batch_at - created


def collector_round(num_envs: int, frames_per_batch: int, frames: int) -> tuple[int, float, float]:
    return asyncio.run(_collector_round(num_envs, frames_per_batch, frames))


def torchrl_round(num_envs: int, frames_per_batch: int, frames: int) -> tuple[int, float, float]:
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import GymEnv as TorchRLGymEnv
    from torchrl.envs import SerialEnv

    n_batches = max(1, frames // frames_per_batch)
    policy = TensorDictModule(CategoricalMLPPolicy(), in_keys=["observation"], out_keys=["action"])
    created = now()
    env = SerialEnv(num_envs, partial(TorchRLGymEnv, ENV_ID, categorical_action_encoding=True))
    collector = TorchRLCollector(
        env, policy, frames_per_batch=frames_per_batch, total_frames=(n_batches + 1) * frames_per_batch
    )
    collected = 0
    first_batch_at: float | None = None
    try:
        for batch in collector:
            if first_batch_at is None:
                first_batch_at = now()
                continue
            collected += batch.numel()
        finished = now()
    finally:
        collector.shutdown()
    if first_batch_at is None:
        raise RuntimeError("the torchrl collector yielded no batch")
    return collected, finished - first_batch_at, first_batch_at - created


def _unavailable(module: str) -> str | None:
    """Why ``module`` cannot be used here, or ``None`` if it imports."""
    try:
        __import__(module)
    except Exception as exc:  # any import failure just means "skip this contender"
        return f"{module} unavailable ({type(exc).__name__}: {exc})"
    if module == "acollect":
        import acollect

        if not hasattr(acollect, "Collector"):
            return "acollect.Collector unavailable in this checkout"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=100_000, help="timed frames per round (after warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender, run in turns")
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs in the vector env")
    parser.add_argument("--frames-per-batch", type=int, default=2048, help="frames per batch (T = this / num-envs)")
    parser.add_argument("--torchrl", action="store_true", help="also run torchrl's Collector with SerialEnv")
    parser.add_argument("--no-collector", action="store_true", help="run the hand loop only")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="wall time, or this process's CPU time (steadier on a loaded machine; everything here runs in-process)",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    for name in ("frames", "rounds", "num_envs", "frames_per_batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.frames_per_batch % args.num_envs:
        parser.error(f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-envs ({args.num_envs})")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    set_clock(args.clock)
    single_thread_torch()
    sizes = (args.num_envs, args.frames_per_batch, args.frames)
    seeds = itertools.count()
    contenders: list[tuple[str, Any]] = [
        ("hand loop", lambda: hand_loop_round(*sizes, seed=next(seeds))),
    ]
    if not args.no_collector:
        reason = _unavailable("acollect")
        contenders.append(("acollect.Collector", reason or (lambda: collector_round(*sizes))))
    if args.torchrl:
        reason = _unavailable("torchrl")
        contenders.append((f"torchrl Collector, SerialEnv({args.num_envs})", reason or (lambda: torchrl_round(*sizes))))

    print(
        f"{ENV_ID}, {args.num_envs} envs, frames_per_batch={args.frames_per_batch}, "
        f"{args.frames:,} timed frames x {args.rounds} rounds, torch threads={torch.get_num_threads()}"
    )
    results = run_interleaved(contenders, args.rounds)
    print()
    print(format_table(results, baseline="hand loop"))
    by_name = {r.name: r for r in results}
    ratio = None
    collector = by_name.get("acollect.Collector")
    if collector is not None and collector.frames_per_s:
        ratio = collector.median / by_name["hand loop"].median
        verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
        print(f"\ncollector / hand loop = {ratio:.2f} ({verdict} the target of {TARGET_RATIO})")
    payload = {
        "benchmark": "inprocess",
        "env": ENV_ID,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine_info(),
        "results": [r.as_dict() for r in results],
        "collector_over_hand_loop": ratio,
        "target_ratio": TARGET_RATIO,
    }
    if args.json is not None:
        write_json(args.json, payload)
        print(f"results written to {args.json}")
    return payload


if __name__ == "__main__":
    main()
