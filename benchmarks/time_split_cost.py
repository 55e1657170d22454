"""What measuring where the time goes costs: the in-process collector with its stopwatch, and with it switched off.

Both contenders run in one process, turns alternating, over the fastest env at hand (CartPole-v1, 8 envs in a
``SyncVectorEnv``, a 4-64-64-2 MLP): the workload where three clock reads per step weigh the most. Switched off,
:meth:`acollect._time_split.Stopwatch.switch` does nothing.

    python benchmarks/time_split_cost.py --turns 6
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import torch
from tensordict.nn import TensorDictModule

from acollect import Collector
from acollect._time_split import Stopwatch
from acollect.envs import GymEnv


def policy() -> TensorDictModule:
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 2))  # fmt: skip

    class Greedy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return self.net(observation).argmax(-1)

    return TensorDictModule(Greedy(), in_keys=["observation"], out_keys=["action"])


async def measure(turns: int, batches: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    switch = Stopwatch.switch
    rates: dict[str, list[float]] = {"stopwatch on": [], "stopwatch off": []}
    async with Collector(lambda: GymEnv("CartPole-v1", num_envs=8), policy(), frames_per_batch=1024) as collector:
        for _ in range(5):
            await anext(collector)  # warm
        for index in range(turns):
            for name in list(rates) if index % 2 == 0 else list(reversed(rates)):
                Stopwatch.switch = switch if name == "stopwatch on" else (lambda self, part: None)  # type: ignore[method-assign]
                await anext(collector)  # the first batch of a turn runs across the switch: untimed
                started, frames = time.perf_counter(), 0
                for _ in range(batches):
                    frames += (await anext(collector)).numel()
                rates[name].append(frames / (time.perf_counter() - started))
        Stopwatch.switch = switch  # type: ignore[method-assign]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--batches", type=int, default=20, help="timed batches of 1,024 frames per turn")
    args = parser.parse_args()
    rates = anyio.run(measure, args.turns, args.batches)
    for name, values in rates.items():
        print(f"{name:14s} median {statistics.median(values):9,.0f} frames/s  (turns: "
              + ", ".join(f"{v:,.0f}" for v in values) + ")")  # fmt: skip
    ratio = statistics.median(rates["stopwatch on"]) / statistics.median(rates["stopwatch off"])
    spread = max(rates["stopwatch off"]) / min(rates["stopwatch off"])
    print(f"on / off: {ratio:.3f}x (the off contender's own spread across turns: {spread:.3f}x)")


if __name__ == "__main__":
    main()
