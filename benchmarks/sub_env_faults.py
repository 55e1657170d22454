"""What a sub-env's fault costs: the sub-env rebuilt alone against the whole vector env rebuilt.

``GymEnv("CartPole-v1", num_envs=8)``-like envs (a plain ``SyncVectorEnv`` of 8 CartPoles) through the rollout
engine with ``env_errors="restart"`` and random actions, three ways, taking turns (none, alone, whole, then the
reference with ``env_errors="raise"`` twice, then back: whole, alone, none):

* ``none``: no fault, the reference;
* ``alone``: sub-env 3 raises at every ``--every``-th step of its life, and is rebuilt alone (its neighbours
  step on);
* ``whole``: the same faults in a ``SyncVectorEnv`` subclass, which acollect steps whole: the whole vector env is
  rebuilt from its factory and reset, every episode in flight cut.

A fault's cost is the extra time of a run with faults over the reference, divided by its faults. The warnings each
fault logs are silenced, alike for both. Also reported: the no-fault run with ``env_errors="restart"`` against
``"raise"``, the runs taking turns (what containing faults costs when none happens).

Run ``python benchmarks/sub_env_faults.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import SyncVectorEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import machine_info, single_thread_torch, write_json

from acollect._rollout.build import build_engine
from acollect._rollout.spec import RolloutSpec
from acollect.envs import GymEnv

N_ENVS, FAULTY = 8, 3


class FaultyCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that raises at every ``every``-th step of its life (``0``: never)."""

    def __init__(self, every: int) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.every, self.life = every, 0

    def step(self, action: Any) -> Any:
        self.life += 1
        if self.every and self.life % self.every == 0:
            raise RuntimeError("injected fault")
        return self.env.step(action)


class StepsWhole(SyncVectorEnv):
    """A vector env of the user's own: acollect steps it whole, so it is rebuilt whole after a fault."""


def make(every: int, whole: bool) -> GymEnv:
    fns = [functools.partial(FaultyCartPole, every if i == FAULTY else 0) for i in range(N_ENVS)]
    return GymEnv((StepsWhole if whole else SyncVectorEnv)(fns))


def run(args: argparse.Namespace, how: str, errors: str = "restart") -> tuple[float, int]:
    """Seconds for ``--batches`` batches (after one), and the faults survived."""
    every = 0 if how == "none" else args.every
    create = functools.partial(make, every, how == "whole")
    spec = RolloutSpec(create_env_fn=create, frames_per_batch=N_ENVS * args.steps, env_errors=errors)
    engine = build_engine(spec, blocking=True)
    try:
        engine.collect()
        before = engine.env_restarts
        start = time.perf_counter()
        for _ in range(args.batches):
            engine.collect()
        return time.perf_counter() - start, engine.env_restarts - before
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="timed batches per run (default 20)")
    parser.add_argument("--steps", type=int, default=256, help="steps per batch (default 256: 2048 frames)")
    parser.add_argument("--every", type=int, default=200, help="sub-env 3 raises every this many steps (200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of none, alone, whole, raise, and back")
    parser.add_argument("--json", type=Path, default=None, help="write the figures there")
    args = parser.parse_args()
    single_thread_torch()
    logging.getLogger("acollect").setLevel(logging.CRITICAL)  # one warning with a traceback per fault, alike
    times: dict[str, list[float]] = {"none": [], "alone": [], "whole": [], "raise": []}
    faults: dict[str, int] = {"alone": 0, "whole": 0}
    for _ in range(args.rounds):
        for how in ("none", "alone", "whole", "raise", "raise", "whole", "alone", "none"):
            seconds, n = run(args, "none", errors="raise") if how == "raise" else run(args, how)
            times[how].append(seconds)
            if how in faults:
                faults[how] += n
    runs = 2 * args.rounds
    base = statistics.median(times["none"])
    frames = args.batches * N_ENVS * args.steps
    print(f"{N_ENVS} CartPoles in a SyncVectorEnv, {frames} frames a run, sub-env {FAULTY} raising every "
          f"{args.every} steps of its life; medians of {runs} runs")  # fmt: skip
    print(f"no fault:                  {base:.3f} s  ({frames / base:,.0f} frames/s)")
    cost = {}
    for how in ("alone", "whole"):
        t = statistics.median(times[how])
        per_run = faults[how] / runs
        cost[how] = (t - base) / per_run * 1000 if per_run else float("nan")
        print(f"faults, rebuilt {how:<6}     {t:.3f} s  ({per_run:.0f} faults a run: {cost[how]:.2f} ms a fault)")
    print(f"a fault rebuilt whole costs {cost['whole'] / cost['alone']:.1f}x one rebuilt alone")
    raise_t = statistics.median(times["raise"])
    print(f"no fault, env_errors='restart' / 'raise': {base / raise_t:.3f} (time)")
    if args.json is not None:
        write_json(args.json, {"times": times, "faults": faults, "cost_ms": cost, "machine": machine_info(),
                               "args": {k: str(v) for k, v in vars(args).items()}})  # fmt: skip


if __name__ == "__main__":
    main()
