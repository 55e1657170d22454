"""What measuring where the time goes costs: the in-process collector with its stopwatch, and with it switched off.

Three contenders run in one process, turns alternating in rotating order, over the fastest env at hand
(CartPole-v1, 8 envs in a ``SyncVectorEnv``, a 4-64-64-2 MLP): the workload where the clock reads weigh the most.

* ``off``: :meth:`acollect._time_split.Stopwatch.switch` does nothing and the kernel is not asked (no
  ``schedstat`` read per batch);
* ``clock``: the three clock reads per step, the kernel still not asked;
* ``clock+schedstat``: what runs by default: the clock reads, and one read of ``/proc/thread-self/schedstat`` per
  batch for the wait for a core (where the platform has it; the line printed says whether it does).

    python benchmarks/time_split_cost.py --turns 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import anyio
import torch
from tensordict.nn import TensorDictModule

import acollect._time_split as time_split
from acollect import Collector
from acollect._time_split import Stopwatch
from acollect.envs import GymEnv

CONTENDERS = ("off", "clock", "clock+schedstat")


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


def _set(name: str, switch: Callable[..., None], read: Callable[[], Any]) -> None:
    """Makes the stopwatch of contender ``name`` the one every engine uses (patched on the class and module)."""
    Stopwatch.switch = switch if name != "off" else (lambda self, part: None)  # type: ignore[method-assign]
    time_split.read_schedstat = read if name == "clock+schedstat" else (lambda: None)  # type: ignore[assignment]


async def measure(turns: int, batches: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    switch, read = Stopwatch.switch, time_split.read_schedstat
    rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    try:
        async with Collector(lambda: GymEnv("CartPole-v1", num_envs=8), policy(), frames_per_batch=1024) as collector:
            for _ in range(5):
                await anext(collector)  # warm
            for index in range(turns):
                shift = index % len(CONTENDERS)
                for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                    _set(name, switch, read)
                    await anext(collector)  # the first batch of a turn runs across the switch: untimed
                    started, frames = time.perf_counter(), 0
                    for _ in range(batches):
                        frames += (await anext(collector)).numel()
                    rates[name].append(frames / (time.perf_counter() - started))
    finally:
        Stopwatch.switch, time_split.read_schedstat = switch, read  # type: ignore[method-assign]
    return rates


def read_cost_us(calls: int = 2000) -> float | None:
    """Microseconds one :func:`acollect._time_split.read_schedstat` takes (median of ``calls``; ``None``: no such
    file here): what a batch pays for the wait for a core, whatever the turns' noise."""
    if time_split.read_schedstat() is None:
        return None
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        time_split.read_schedstat()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--batches", type=int, default=20, help="timed batches of 1,024 frames per turn")
    args = parser.parse_args()
    one_read = read_cost_us()
    rates = anyio.run(measure, args.turns, args.batches)
    for name, values in rates.items():
        print(f"{name:16s} median {statistics.median(values):9,.0f} frames/s  (turns: "
              + ", ".join(f"{v:,.0f}" for v in values) + ")")  # fmt: skip
    # Each turn runs every contender back to back: the ratio within a turn is spared the machine's drift between
    # turns (the median of those is the figure to quote where the turns' own spread is large).
    for name, against in (("clock", "off"), ("clock+schedstat", "off"), ("clock+schedstat", "clock")):
        medians = statistics.median(rates[name]) / statistics.median(rates[against])
        paired = statistics.median(a / b for a, b in zip(rates[name], rates[against], strict=True))
        print(f"{name} / {against}: {medians:.3f}x (medians), {paired:.3f}x (median of the turns' ratios)")
    spread = max(rates["off"]) / min(rates["off"])
    print(f"(the off contender's own spread across turns: {spread:.3f}x)")
    if one_read is None:
        print("no /proc/thread-self/schedstat here: the wait for a core is not measured, and costs nothing")
    else:
        batch_us = 1024 / statistics.median(rates["clock"]) * 1e6
        share = one_read / batch_us
        print(f"one schedstat read: {one_read:.1f} us, once per batch of {batch_us:,.0f} us: {share:.3%} of it")


if __name__ == "__main__":
    main()
