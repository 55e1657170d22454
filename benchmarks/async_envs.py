"""Coroutine envs: frames/s against the latency bound and against an ``asyncio.gather`` lockstep loop.

Envs that wait rather than compute (a service over the network) are simulated by an
:class:`acollect.envs.AsyncEnv` whose ``step`` sleeps (``anyio.sleep``): with ``--envs 256``, a
latency drawn uniformly from 1-30 ms, and 100 ms for 5% of the steps. The policy is a 4-64-2 Tanh MLP
sampling a categorical action, one torch thread.

Contenders, ``--rounds`` rounds of ``--seconds`` each, in turns:

* ``baseline`` (lag only): the ticker alone on the loop, what the machine's other jobs cost it;
* ``acollect``: ``Collector(lambda: AsyncEnvPool(LatencyEnv, num_envs=256), policy, frames_per_batch=4096)``,
  every env a task on the loop, the policy over the envs waiting; a 1 ms ticker task records how late the
  loop wakes it (the lag any other task of the trainer sees) while batches are collected;
* ``gather``: the loop one writes without acollect: each step, the policy on every env's observation,
  then ``await asyncio.gather(*(env.step(a) for ...))``, so every step waits for the slowest env.

The bound is what no collector can beat: ``envs / mean latency`` frames/s. Goals: acollect >= 0.7x the
bound, >= 3x the gather loop, loop lag p99 <= 5 ms. A second scenario, ``--many-envs 1024`` envs of a
fixed 50 ms, reports frames/s against its bound (goal >= 0.6x), the CPU time per step and the memory
per env (the growth of this process's RSS from before the collector to after its first batches).

    python benchmarks/async_envs.py --json docs/data/async-envs.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import machine_info, single_thread_torch, write_json

from acollect import Collector
from acollect.envs import AsyncEnv, AsyncEnvPool

GOALS = {"vs_bound": 0.7, "vs_gather": 3.0, "lag_p99_ms": 5.0, "many_vs_bound": 0.6}


class LatencyEnv(AsyncEnv):
    """Sleeps like a remote service: ``fixed`` seconds, or 1-30 ms with 5% of the steps at 100 ms."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fixed: float | None = None, episode_length: int = 200) -> None:
        self.fixed, self.episode_length = fixed, episode_length
        self.rng = random.Random()
        self.obs = np.zeros(4, np.float32)
        self.n = 0

    def latency(self) -> float:
        if self.fixed is not None:
            return self.fixed
        return 0.100 if self.rng.random() < 0.05 else self.rng.uniform(0.001, 0.030)

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.rng.seed(seed)
        self.n = 0
        return self.obs, {}

    async def step(self, action: Any) -> Any:
        await anyio.sleep(self.latency())
        self.n += 1
        return self.obs, 1.0, False, self.n >= self.episode_length, {}


def mean_latency(fixed: float | None) -> float:
    return fixed if fixed is not None else 0.95 * (0.001 + 0.030) / 2 + 0.05 * 0.100


class Policy(torch.nn.Module):
    """4-64-2 Tanh MLP, a categorical action sampled from its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(self.net(observation), -1), 1).squeeze(-1)


class Ticker:
    """A task sleeping 1 ms at a time, recording how late it wakes."""

    def __init__(self) -> None:
        self.late_ms: list[float] = []
        self.on = False

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await anyio.sleep(0.001)
            if self.on:
                self.late_ms.append((time.perf_counter() - start - 0.001) * 1e3)


async def acollect_round(collector: Collector, seconds: float, ticker: Ticker) -> dict[str, float]:
    frames, start, cpu = 0, time.perf_counter(), time.process_time()
    ticker.on = True
    while time.perf_counter() - start < seconds:
        frames += (await anext(collector)).numel()
    ticker.on = False
    wall = time.perf_counter() - start
    return {"frames": frames, "seconds": wall, "fps": frames / wall, "cpu_s": time.process_time() - cpu}


async def gather_round(envs: list[LatencyEnv], policy: Policy, seconds: float) -> dict[str, float]:
    obs = torch.from_numpy(np.stack([(await env.reset())[0] for env in envs]))
    frames, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        with torch.inference_mode():
            actions = policy(obs).tolist()
        results = await asyncio.gather(*(env.step(a) for env, a in zip(envs, actions, strict=True)))
        obs = torch.from_numpy(np.stack([r[0] for r in results]))
        frames += len(envs)
    wall = time.perf_counter() - start
    return {"frames": frames, "seconds": wall, "fps": frames / wall, "cpu_s": time.process_time() - cpu}


def p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) if xs else float("nan")


async def mixed_latency(args: argparse.Namespace) -> dict[str, Any]:
    policy, ticker = Policy(), Ticker()
    envs = [LatencyEnv() for _ in range(args.envs)]
    rounds: list[dict[str, Any]] = []
    baseline = Ticker()
    async with anyio.create_task_group() as tg:  # the loop's lag with nothing else on it: the machine's share
        tg.start_soon(baseline.run)
        baseline.on = True
        await anyio.sleep(args.seconds)
        tg.cancel_scope.cancel()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        async with Collector(lambda: AsyncEnvPool(LatencyEnv, num_envs=args.envs), policy,
                             frames_per_batch=args.frames_per_batch, total_frames=-1) as collector:  # fmt: skip
            await anext(collector)  # warm-up
            for r in range(args.rounds):
                measured = await acollect_round(collector, args.seconds, ticker)
                rounds.append({"contender": "acollect", "round": r, **measured})
                rounds.append({"contender": "gather", "round": r, **await gather_round(envs, policy, args.seconds)})
            in_thread = collector._engine.policy_in_thread  # type: ignore[union-attr]
        tg.cancel_scope.cancel()
    fps = {c: sum(x["frames"] for x in rounds if x["contender"] == c) / sum(
        x["seconds"] for x in rounds if x["contender"] == c) for c in ("acollect", "gather")}  # fmt: skip
    bound = args.envs / mean_latency(None)
    return {
        "envs": args.envs,
        "mean_latency_s": mean_latency(None),
        "bound_fps": bound,
        "acollect_fps": fps["acollect"],
        "gather_fps": fps["gather"],
        "vs_bound": fps["acollect"] / bound,
        "vs_gather": fps["acollect"] / fps["gather"],
        "lag_p99_ms": p99(ticker.late_ms),
        "lag_median_ms": statistics.median(ticker.late_ms) if ticker.late_ms else float("nan"),
        "lag_max_ms": max(ticker.late_ms, default=float("nan")),
        "lag_baseline_p99_ms": p99(baseline.late_ms),
        "policy_in_thread": in_thread,
        "rounds": rounds,
    }


async def many_envs(args: argparse.Namespace) -> dict[str, Any]:
    process = psutil.Process()
    rss_before = process.memory_info().rss
    make = lambda: AsyncEnvPool(lambda: LatencyEnv(fixed=args.many_latency), num_envs=args.many_envs)  # noqa: E731
    async with Collector(make, Policy(), frames_per_batch=args.many_envs * 16, total_frames=-1) as collector:
        await anext(collector)
        result = await acollect_round(collector, args.seconds * args.rounds, Ticker())
        rss_after = process.memory_info().rss
    bound = args.many_envs / args.many_latency
    return {
        "envs": args.many_envs,
        "latency_s": args.many_latency,
        "bound_fps": bound,
        "acollect_fps": result["fps"],
        "vs_bound": result["fps"] / bound,
        "cpu_us_per_step": result["cpu_s"] / result["frames"] * 1e6,
        "cpu_share": result["cpu_s"] / result["seconds"],
        "memory_per_env_kb": (rss_after - rss_before) / args.many_envs / 1024,
        "frames_per_batch": args.many_envs * 16,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--frames-per-batch", type=int, default=4096)
    parser.add_argument("--many-envs", type=int, default=1024)
    parser.add_argument("--many-latency", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    single_thread_torch()
    machine = machine_info()
    mixed = anyio.run(mixed_latency, args)
    many = anyio.run(many_envs, args)
    print(f"{args.envs} envs, 1-30 ms (5% at 100 ms): acollect {mixed['acollect_fps']:,.0f} frames/s = "
          f"{mixed['vs_bound']:.2f}x the bound ({mixed['bound_fps']:,.0f}), {mixed['vs_gather']:.2f}x the gather "
          f"loop ({mixed['gather_fps']:,.0f}); loop lag p99 {mixed['lag_p99_ms']:.2f} ms "
          f"(the ticker alone: {mixed['lag_baseline_p99_ms']:.2f} ms)")  # fmt: skip
    print(f"{args.many_envs} envs at {args.many_latency * 1e3:.0f} ms: {many['acollect_fps']:,.0f} frames/s = "
          f"{many['vs_bound']:.2f}x the bound; {many['cpu_us_per_step']:.1f} us CPU per step; "
          f"{many['memory_per_env_kb']:.1f} KiB per env")  # fmt: skip
    if args.json:
        write_json(args.json, {"benchmark": "async_envs", "args": vars(args), "machine": machine, "goals": GOALS,
                               "mixed_latency": mixed, "many_envs": many})  # fmt: skip


if __name__ == "__main__":
    main()
