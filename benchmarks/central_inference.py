"""Central inference (AsyncBatchedCollector) against the policy in every worker (MultiAsyncCollector).

Both collectors start once, then take turns (a few batches each, the order alternating; before each turn the
run waits, untimed, until every contender's processes are idle again, and the batches one collected ahead
while the others had their turns are drained untimed), in the same run; wall time and
the CPU time of the trainer and its workers are both reported. 2 workers x 16 envs by default, one
torch thread per worker (and in this process, where the inference server runs):

* ``cartpole``: CartPole-v1 and the reference 4-64-64-2 MLP (benchmarks/_common.py): what the round
  trip per step costs when the policy is tiny (goal: >= 0.7x MultiAsyncCollector);
* ``mlp-large``: CartPole-v1 and a 4-1024-1024-1024-2 MLP: a policy worth batching;
* ``cnn``: 84x84x4 uint8 pixels (acollect.testing.PixelEnv, no step cost) and a small CNN (Nature DQN
  layout: 32 8x8/4, 64 4x4/2, 64 3x3/1, 512): the pixel policy of Atari agents;
* ``atari``: a real game, Pong through ale-py's ``AtariVectorEnv`` (4x84x84 uint8 frames, the atari extra) and
  the same CNN (6 actions); an *env-only* contender (``MultiAsyncCollector`` with random actions in the workers)
  says what the envs can do, and central inference should keep up with it;
* ``atari-standin``: Pong, and a server policy whose forward sleeps ``--sleep-ms`` (2 by default) and returns
  random actions: a GPU pass's latency without a GPU (``time.sleep`` frees the core, as a pass on a device does),
  against the env-only contender.

Each server's pass (``forward_ms_mean``: gathering the requests, the policy, the actions split back) is also set
against the same policy's bare pass over as many observations in this process (``bare_pass_ms``).

``--train-ms T`` makes the trainer work T ms (pure Python, the GIL held) after every batch, as an async trainer
that trains on the event loop's thread does.

Each ``--servers`` mode is a contender of its own: ``process`` (the default server, a process of its own) and
``thread`` (a thread of the trainer, sharing its GIL).

With ``--device cuda`` the server runs the policy on the GPU while MultiAsyncCollector's workers run it on
their CPU: the point of central inference.

    python benchmarks/central_inference.py --workload cartpole --json docs/data/central-cartpole.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import psutil
import torch
from _common import CategoricalMLPPolicy, Turns, cpu_of, machine_info, settle, single_thread_torch, write_json
from tensordict.nn import TensorDictModule
from torch import nn

from acollect import AsyncBatchedCollector, MultiAsyncCollector
from acollect.testing import PixelEnv

WORKLOADS = ("cartpole", "mlp-large", "cnn", "atari", "atari-standin")
MULTI = "MultiAsyncCollector (policy in every worker)"
ENV_ONLY = "MultiAsyncCollector (env only: random actions in the workers)"
PONG_ACTIONS = 6
BATCHED = {
    "process": "AsyncBatchedCollector (server process)",
    "thread": "AsyncBatchedCollector (server thread)",
}


class Categorical(nn.Module):
    """Logits network in, sampled action out."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(self.net(x), dim=-1), 1).squeeze(-1)


class PixelsIn(nn.Module):
    """uint8 ``[N, 84, 84, 4]`` pixels to a float ``[N, 4, 84, 84]`` CNN input."""

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels.permute(0, 3, 1, 2).float().div_(255)


class Frames(nn.Module):
    """uint8 ``[N, 4, 84, 84]`` Atari frames (ale-py's layout) to a float CNN input."""

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.float().div_(255)


class SleepThenRandom(nn.Module):
    """A stand-in for a pass on a device: sleeps (freeing the core, as waiting on a GPU does), acts at random."""

    def __init__(self, ms: float, actions: int) -> None:
        super().__init__()
        self.ms, self.actions = ms, actions

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1000)
        return torch.randint(0, self.actions, observation.shape[:1])


def nature_cnn(stem: nn.Module, actions: int) -> nn.Module:
    return nn.Sequential(
        stem,
        nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
        nn.Linear(512, actions),
    )  # fmt: skip


def policy_for(workload: str, sleep_ms: float = 2.0) -> TensorDictModule:
    if workload == "atari":
        return TensorDictModule(Categorical(nature_cnn(Frames(), PONG_ACTIONS)), in_keys=["observation"],
                                out_keys=["action"])  # fmt: skip
    if workload == "atari-standin":
        return TensorDictModule(SleepThenRandom(sleep_ms, PONG_ACTIONS), in_keys=["observation"], out_keys=["action"])
    if workload == "cartpole":
        return TensorDictModule(CategoricalMLPPolicy(), in_keys=["observation"], out_keys=["action"])
    if workload == "mlp-large":
        net = nn.Sequential(nn.Linear(4, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(),
                            nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 2))  # fmt: skip
        return TensorDictModule(Categorical(net), in_keys=["observation"], out_keys=["action"])
    return TensorDictModule(Categorical(nature_cnn(PixelsIn(), 2)), in_keys=["pixels"], out_keys=["action"])


def pixel_env(num_envs: int) -> PixelEnv:
    return PixelEnv(num_envs=num_envs)


def pong(num_envs: int) -> Any:
    """Pong, one ALE thread: what the worker's core steps (``num_envs`` given, so a worker can split its envs)."""
    from ale_py.vector_env import AtariVectorEnv

    from acollect.envs import GymEnv

    return GymEnv(AtariVectorEnv(game="pong", num_envs=num_envs, num_threads=1))


def env_args(workload: str, envs: int) -> tuple[Any, dict[str, Any]]:
    if workload == "cnn":
        import functools

        return functools.partial(pixel_env, envs), {}
    if workload.startswith("atari"):
        return pong, {"env_kwargs": {"num_envs": envs}}
    return "CartPole-v1", {"env_kwargs": {"num_envs": envs}}


CREDITS = 2


async def _enter(stack: AsyncExitStack, collector: Any) -> tuple[Any, list[int], float]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.perf_counter()
    await stack.enter_async_context(collector)
    for _ in range(2 * collector.num_workers):
        await anext(collector)  # every worker started and warm
    pids = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    return collector, pids, time.perf_counter() - started


def _train(ms: float) -> None:
    """The trainer's own work after a batch: ``ms`` milliseconds of Python holding the GIL (the worst case for a
    server thread, which needs the same GIL for every step of every worker)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


async def _turn(collector: Any, pids: list[int], batches: int, train_ms: float) -> tuple[int, float, float]:
    """``batches`` timed batches after the ones collected ahead: (frames, wall s, CPU s of trainer and workers)."""
    for _ in range(collector.num_workers * CREDITS):
        await anext(collector)  # collected while the other contender had its turn
    cpu, workers_cpu, wall = time.process_time(), cpu_of(pids), time.perf_counter()
    frames = 0
    for _ in range(batches):
        frames += (await anext(collector)).numel()
        _train(train_ms)
    return frames, time.perf_counter() - wall, time.process_time() - cpu + cpu_of(pids) - workers_cpu


def bare_pass_ms(policy: TensorDictModule, sample: Any, repeats: int = 60) -> float:
    """The median time of the policy's pass over ``sample`` called here, bare: no gather, no answer, no server.

    The reference for the server's ``forward_ms_mean`` (which also gathers the requests into one batch and splits
    the actions back): the same policy, the same batch size, one torch thread in this process as in the server.
    """
    times = []
    with torch.inference_mode():
        for index in range(repeats + 5):
            started = time.perf_counter()
            policy(sample.clone())
            if index >= 5:  # warm-up passes untimed
                times.append(time.perf_counter() - started)
    times.sort()
    return 1000 * times[len(times) // 2]


async def measure(args: argparse.Namespace) -> tuple[Turns, dict[str, Any], dict[str, float]]:
    """Every contender started once, then turns in rotation; returns the turns, each server's stats, start-ups."""
    env, extra = env_args(args.workload, args.envs)
    common: dict[str, Any] = {
        "frames_per_batch": args.frames_per_batch,
        "num_workers": args.workers,
        "start_method": "forkserver",
        "total_frames": -1,
        "credits": CREDITS,
        **extra,
    }
    turns = Turns()
    async with AsyncExitStack() as stack:
        runs: list[tuple[str, Any, list[int]]] = []
        startup: dict[str, float] = {}
        references = [(ENV_ONLY, None)] if args.workload.startswith("atari") else []
        if args.workload != "atari-standin":  # a sleeping policy in every worker measures nothing
            references.append((MULTI, policy_for(args.workload)))
        for name, reference_policy in references:
            collector, pids, startup[name] = await _enter(stack, MultiAsyncCollector(env, reference_policy, **common))
            runs.append((name, collector, pids))
        for mode in args.servers:
            central = AsyncBatchedCollector(
                env, policy_for(args.workload, args.sleep_ms), device=args.device, server=mode,
                env_groups=args.env_groups, passes_in_flight=args.passes_in_flight, **common,
            )  # fmt: skip
            batched, batched_pids, startup[BATCHED[mode]] = await _enter(stack, central)
            runs.append((BATCHED[mode], batched, batched_pids))
        splits: dict[str, list[dict[str, float]]] = {}  # where the workers' time went, after each turn
        for index in range(args.turns):
            line = []
            shift = index % len(runs)
            for name, collector, pids in runs[shift:] + runs[:shift]:
                # Untimed: the others' workers finish collecting ahead first, or they take this turn's cores.
                await settle([pid for _, _, run_pids in runs for pid in run_pids])
                frames, wall, cpu = await _turn(collector, pids, args.turn_batches, args.train_ms)
                turns.add(name, frames, wall, cpu)
                line.append(f"{name} {frames / wall:,.0f}")
                splits.setdefault(name, []).append(collector.stats().time_split)
            print(f"turn {index + 1}/{args.turns}: " + ", ".join(line) + " frames/s", flush=True)
        for name, per_turn in splits.items():
            # The window spans the last 10 s: the turn just taken, and the others' (the workers wait for credits).
            mean = {part: sum(split[part] for split in per_turn) / len(per_turn) for part in per_turn[0]}
            print(f"{name}: workers' time " + ", ".join(f"{part} {share:.0%}" for part, share in mean.items()))
        servers = {name: collector.stats().inference for name, collector, _ in runs if name in BATCHED.values()}
        for name, collector, _ in runs:
            if name in servers:
                # The bare pass over as many observations as the server's mean batch, taken from a real batch.
                policy = policy_for(args.workload, args.sleep_ms)
                rows = max(1, round(servers[name]["mean_batch_size"]))
                sample = (await anext(collector)).select(*policy.in_keys).reshape(-1)[:rows].clone()
                if args.device is not None:
                    policy, sample = policy.to(args.device), sample.to(args.device)
                servers[name]["bare_pass_ms"] = bare_pass_ms(policy, sample)
    return turns, servers, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=WORKLOADS, default="cartpole")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=16, help="envs per worker")
    parser.add_argument("--frames-per-batch", type=int, default=None, help="frames of one worker's batch")
    parser.add_argument("--turns", type=int, default=6, help="turns of each contender (alternating)")
    parser.add_argument("--turn-batches", type=int, default=None, help="timed batches per turn")
    parser.add_argument("--device", default=None, help="the inference server's device (e.g. cuda)")
    parser.add_argument(
        "--train-ms",
        type=float,
        default=0.0,
        help="milliseconds of Python work (GIL held) the trainer does after each batch",
    )
    parser.add_argument(
        "--env-groups", type=int, default=None, help="AsyncBatchedCollector's env_groups (default: its own)"
    )
    parser.add_argument("--sleep-ms", type=float, default=2.0, help="the atari-standin server's pass (milliseconds)")
    parser.add_argument(
        "--passes-in-flight", type=int, default=None, help="AsyncBatchedCollector's passes_in_flight (default: its own)"
    )
    parser.add_argument(
        "--servers",
        default="process,thread",
        help="AsyncBatchedCollector contenders, by where the server runs (comma-separated)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.servers = [mode.strip() for mode in args.servers.split(",") if mode.strip()]
    if not args.servers or any(mode not in BATCHED for mode in args.servers):
        parser.error(f"--servers: a comma-separated list of {sorted(BATCHED)}, got {args.servers}")
    heavy = args.workload != "cartpole"
    args.frames_per_batch = args.frames_per_batch or args.envs * (16 if heavy else 64)
    args.turn_batches = args.turn_batches or (4 if heavy else 8)
    single_thread_torch()
    turns, servers, startup = asyncio.run(measure(args))
    rates = turns.rates()
    for name in rates:
        print(f"{name:<64} {rates[name]['wall']:>9,.0f} frames/s wall  {rates[name]['cpu']:>9,.0f} frames per CPU-s")
    ratios: dict[str, dict[str, float]] = {}
    print()
    reference = ENV_ONLY if ENV_ONLY in rates else MULTI
    for name, server in servers.items():
        wall = rates[name]["wall"] / rates[reference]["wall"]
        cpu = rates[name]["cpu"] / rates[reference]["cpu"]
        ratios[name] = {"wall": wall, "cpu": cpu, "reference": reference}  # type: ignore[dict-item]
        print(
            f"{name} / {reference}: {wall:.2f}x wall, {cpu:.2f}x CPU; server: mean batch "
            f"{server['mean_batch_size']:.1f} (fill {server['fill_rate']:.0%}), "
            f"latency p50 {server['latency_ms_p50']:.3f} ms, p99 {server['latency_ms_p99']:.2f} ms, "
            f"pass {server['forward_ms_mean']:.3f} ms, the same pass bare {server['bare_pass_ms']:.3f} ms "
            f"({server['forward_ms_mean'] / server['bare_pass_ms']:.2f}x)"
        )
    if MULTI in rates and reference != MULTI:
        ratio = rates[MULTI]["wall"] / rates[reference]["wall"]
        print(f"{MULTI} / {reference}: {ratio:.2f}x wall")
    if args.json:
        write_json(args.json, {"benchmark": "central_inference", "args": vars(args), "machine": machine_info(),
                               "turns": turns.as_dict(), "ratios": ratios, "servers": servers,
                               "startup_s": startup})  # fmt: skip


if __name__ == "__main__":
    main()
