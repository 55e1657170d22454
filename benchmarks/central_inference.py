"""Central inference (AsyncBatchedCollector) against the policy in every worker (MultiAsyncCollector).

Same run, rounds alternating, 2 workers x 16 envs by default, one torch thread per worker (and in
this process, where the inference server runs):

* ``cartpole``: CartPole-v1 and the reference 4-64-64-2 MLP (benchmarks/_common.py): what the round
  trip per step costs when the policy is tiny (goal: >= 0.7x MultiAsyncCollector);
* ``mlp-large``: CartPole-v1 and a 4-1024-1024-1024-2 MLP: a policy worth batching;
* ``cnn``: 84x84x4 uint8 pixels (acollect.testing.PixelEnv, no step cost) and a small CNN (Nature DQN
  layout: 32 8x8/4, 64 4x4/2, 64 3x3/1, 512): the pixel policy of Atari agents.

With ``--device cuda`` the server runs the policy on the GPU while MultiAsyncCollector's workers run it on
their CPU: the point of central inference.

    python benchmarks/central_inference.py --workload cartpole --json docs/data/central_inference-cartpole.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import anyio
import torch
from _common import CategoricalMLPPolicy, format_table, machine_info, run_interleaved, single_thread_torch, write_json
from tensordict.nn import TensorDictModule
from torch import nn

from acollect import AsyncBatchedCollector, MultiAsyncCollector
from acollect.testing import PixelEnv

WORKLOADS = ("cartpole", "mlp-large", "cnn")


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


def policy_for(workload: str) -> TensorDictModule:
    if workload == "cartpole":
        return TensorDictModule(CategoricalMLPPolicy(), in_keys=["observation"], out_keys=["action"])
    if workload == "mlp-large":
        net = nn.Sequential(nn.Linear(4, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(),
                            nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 2))  # fmt: skip
        return TensorDictModule(Categorical(net), in_keys=["observation"], out_keys=["action"])
    cnn = nn.Sequential(
        PixelsIn(),
        nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 2),
    )  # fmt: skip
    return TensorDictModule(Categorical(cnn), in_keys=["pixels"], out_keys=["action"])


def pixel_env(num_envs: int) -> PixelEnv:
    return PixelEnv(num_envs=num_envs)


def env_args(workload: str, envs: int) -> tuple[Any, dict[str, Any]]:
    if workload == "cnn":
        import functools

        return functools.partial(pixel_env, envs), {}
    return "CartPole-v1", {"env_kwargs": {"num_envs": envs}}


def contender(
    kind: str, args: argparse.Namespace, server_stats: list[dict[str, Any]]
) -> Callable[[], tuple[int, float, float]]:
    def run() -> tuple[int, float, float]:
        async def main() -> tuple[int, float, float]:
            env, extra = env_args(args.workload, args.envs)
            common: dict[str, Any] = {
                "frames_per_batch": args.frames_per_batch,
                "start_method": "forkserver",
                "num_workers": args.workers,
                **extra,
            }
            policy = policy_for(args.workload)
            if kind == "batched":
                collector: Any = AsyncBatchedCollector(env, policy, device=args.device, **common)
            else:
                collector = MultiAsyncCollector(env, policy, **common)
            started = time.perf_counter()
            async with collector:
                await anext(collector)  # untimed: workers start, envs reset, first batch
                startup = time.perf_counter() - started
                frames, t0 = 0, time.perf_counter()
                while frames < args.frames:
                    frames += (await anext(collector)).numel()
                seconds = time.perf_counter() - t0
                if kind == "batched":
                    server_stats.append(collector.stats().inference)
            return frames, seconds, startup

        result: tuple[int, float, float] = anyio.run(main)
        return result

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=WORKLOADS, default="cartpole")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=16, help="envs per worker")
    parser.add_argument("--frames", type=int, default=None, help="timed frames per round")
    parser.add_argument("--frames-per-batch", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default=None, help="the inference server's device (e.g. cuda)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    heavy = args.workload != "cartpole"
    args.frames = args.frames or (8_192 if heavy else 65_536)
    args.frames_per_batch = args.frames_per_batch or args.envs * (16 if heavy else 64)
    single_thread_torch()
    server_stats: list[dict[str, Any]] = []
    results = run_interleaved(
        [("MultiAsyncCollector (policy in workers)", contender("multi", args, server_stats)),
         (f"AsyncBatchedCollector (server on {args.device or 'cpu'})", contender("batched", args, server_stats))],
        args.rounds,
    )  # fmt: skip
    print(format_table(results, baseline=results[0].name))
    ratio = results[1].median / results[0].median
    fill = [s["fill_rate"] for s in server_stats]
    print(f"\nAsyncBatchedCollector / MultiAsyncCollector: {ratio:.2f}x; server fill rate per round: "
          f"{', '.join(f'{f:.2f}' for f in fill)}")  # fmt: skip
    if args.json:
        write_json(args.json, {"benchmark": "central_inference", "args": vars(args), "machine": machine_info(),
                               "results": [r.as_dict() for r in results], "ratio": ratio,
                               "server_stats": server_stats})  # fmt: skip


if __name__ == "__main__":
    main()
