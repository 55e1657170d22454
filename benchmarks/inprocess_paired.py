"""In-process collection against the loop a user writes instead, alternating batch by batch.

``--workload cartpole`` (the default): the reference is :class:`~acollect.cli._reference_loops.CleanRLLoop`,
cleanrl style: ``gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")`` with gymnasium's default
(NEXT_STEP) autoreset, the 4-64-64-2 MLP in a ``TensorDictModule``, observations, actions, rewards and dones
copied into preallocated ``[E, T]`` buffers and cloned per batch. Against it, with the same policy module object
and the same frames per batch:

* ``Collector(lambda: GymEnv("CartPole-v1", num_envs=8))``: acollect builds the vector env;
* ``Collector(lambda: GymEnv(gym.make_vec(..., vectorization_mode="sync")))``: the user's own
  default-autoreset vector env, which acollect wraps as it is (finished sub-envs are reset at
  once, so no transition that did not happen is handed out).

``--workload envpool`` and ``--workload atari``: env sources whose vector env runs in C++ threads, driven by
random actions. The reference is the loop a user writes around that vector env (:class:`RandomActionLoop`:
``env.step(actions)`` with ``torch.randint`` actions, then ``torch.from_numpy`` copies into preallocated
``[E, T]`` buffers, cloned per batch; the env's own NEXT_STEP autoreset, whose no-op steps count as frames
there; for EnvPool also the same loop resetting finished sub-envs at once with ``env.reset(env_ids)``, which
hands out no no-op step, as acollect does), against the in-process ``Collector`` over an env of the same kind
with its random policy:
``envpool.make_gymnasium("CartPole-v1", num_envs=E)`` (returned as is: ``make_env`` wraps it in
``EnvPoolEnv``), or ``GymEnv(AtariVectorEnv(game="pong", num_envs=E))``. Each EnvPool or ALE env gets
``--env-threads`` threads.

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
import warnings
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, CleanRLLoop, Turns, machine_info, make_policy, single_thread_torch, write_json

from acollect import Collector, GymEnv

WORKLOADS = ("cartpole", "envpool", "atari")
REFERENCES = {
    "cartpole": "hand loop (make_vec sync, default autoreset)",
    "envpool": "hand loop (EnvPool CartPole, random actions)",
    "atari": "hand loop (AtariVectorEnv pong, random actions)",
}
GOALS = {"cartpole": 0.95, "envpool": 0.9, "atari": 0.9}
RESETTING_LOOP = "hand loop (EnvPool, finished sub-envs reset at once)"


class RandomActionLoop:
    """The loop a user writes around a vector env with random actions: step, copy into ``[E, T]`` buffers, clone.

    Args:
        env: a vector env with gymnasium's ``reset()`` / ``step(actions)`` (EnvPool, ale-py), owned by the loop.
        frames_per_batch: frames per batch; ``T = frames_per_batch // E``.
        seed: seed of the action generator.
        reset_finished: ``(env, obs, done) -> obs``: resets the finished sub-envs at once and returns the
            observations the next step starts from; ``None`` leaves them to the env's own autoreset.
    """

    def __init__(
        self,
        env: Any,
        frames_per_batch: int,
        *,
        seed: int = 0,
        reset_finished: Callable[[Any, np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.env = env
        self.reset_finished = reset_finished
        obs, _ = env.reset()
        self._obs = obs
        self.num_envs = len(obs)
        self.steps = frames_per_batch // self.num_envs
        # EnvPool before 1.0 is no VectorEnv: its action_space is already one sub-env's.
        self.n_actions = int(getattr(env, "single_action_space", env.action_space).n)
        self.generator = torch.Generator().manual_seed(seed)
        shape = (self.num_envs, self.steps)
        self.buffers = {
            "observation": torch.empty(*shape, *obs.shape[1:], dtype=torch.from_numpy(obs).dtype),
            "action": torch.empty(shape, dtype=torch.int64),
            "reward": torch.empty(shape, dtype=torch.float32),
            "done": torch.empty(shape, dtype=torch.bool),
        }
        self.batch: dict[str, torch.Tensor] = {}

    def collect_batch(self) -> int:
        """Steps every env ``T`` times, then clones the buffers into :attr:`batch`; returns the frame count."""
        env, b, n, generator = self.env, self.buffers, self.num_envs, self.generator
        obs = self._obs
        for t in range(self.steps):
            action = torch.randint(self.n_actions, (n,), generator=generator)
            b["observation"][:, t] = torch.from_numpy(obs)
            b["action"][:, t] = action
            obs, reward, terminated, truncated, _ = env.step(action.numpy())
            b["reward"][:, t] = torch.from_numpy(reward)
            done = terminated | truncated
            b["done"][:, t] = torch.from_numpy(done)
            if self.reset_finished is not None and done.any():
                obs = self.reset_finished(env, obs, done)
        self.batch = {key: buffer.clone() for key, buffer in b.items()}
        self._obs = obs
        return self.steps * n

    def close(self) -> None:
        self.env.close()


def make_envpool(num_envs: int, threads: int) -> Any:
    import envpool

    env = envpool.make_gymnasium(ENV_ID, num_envs=num_envs, num_threads=threads, seed=0)
    with warnings.catch_warnings():  # gymnasium's note on the float64 bounds EnvPool builds its Box spaces from
        warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
        env.observation_space, env.action_space  # noqa: B018  (built, and warned about, on first use)
    return env


def envpool_reset_finished(env: Any, obs: np.ndarray, done: np.ndarray) -> np.ndarray:
    """What a user writes to hand out no no-op step: reset EnvPool's finished sub-envs at once."""
    ids = np.flatnonzero(done).astype(np.int32)
    fresh, _ = env.reset(ids)
    obs = obs.copy()
    obs[ids] = fresh
    return obs


def make_atari(num_envs: int, threads: int) -> Any:
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(game="pong", num_envs=num_envs, num_threads=threads)


def contenders(workload: str, num_envs: int, threads: int) -> dict[str, Any]:
    """Collector rows: name -> env factory."""
    if workload == "envpool":
        return {f"Collector(envpool.make_gymnasium(CartPole, {num_envs}))": lambda: make_envpool(num_envs, threads)}
    if workload == "atari":
        return {f"Collector(GymEnv(AtariVectorEnv(pong, {num_envs})))": lambda: GymEnv(make_atari(num_envs, threads))}
    return {
        f"Collector(GymEnv(id, num_envs={num_envs}))": lambda: GymEnv(ENV_ID, num_envs=num_envs),
        "Collector(GymEnv(gym.make_vec(...)))": lambda: GymEnv(
            gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="sync")
        ),
    }


def hand_loops(args: argparse.Namespace, policy: Any) -> dict[str, CleanRLLoop | RandomActionLoop]:
    """The loops, the reference first. For EnvPool also the loop that, as acollect, hands out no no-op step."""
    reference, e, fpb = REFERENCES[args.workload], args.num_envs, args.frames_per_batch
    if args.workload == "envpool":
        return {
            reference: RandomActionLoop(make_envpool(e, args.env_threads), fpb),
            RESETTING_LOOP: RandomActionLoop(
                make_envpool(e, args.env_threads), fpb, reset_finished=envpool_reset_finished
            ),
        }
    if args.workload == "atari":
        return {reference: RandomActionLoop(make_atari(e, args.env_threads), fpb)}
    return {reference: CleanRLLoop(e, fpb, policy=policy, seed=0)}


async def measure(args: argparse.Namespace) -> Turns:
    # cartpole: one module object for every contender; the other workloads act at random (the collector's
    # random policy, torch.randint in the loop).
    policy = make_policy() if args.workload == "cartpole" else None
    loops = hand_loops(args, policy)
    turns = Turns()
    try:
        async with AsyncExitStack() as stack:
            collectors = {
                name: await stack.enter_async_context(
                    Collector(make_env, policy, frames_per_batch=args.frames_per_batch, total_frames=-1)
                )
                for name, make_env in contenders(args.workload, args.num_envs, args.env_threads).items()
            }
            for _ in range(args.warmup):  # untimed: first calls, thread start-up, allocations
                for loop in loops.values():
                    loop.collect_batch()
                for collector in collectors.values():
                    await anext(collector)

            def hand_batch(loop: CleanRLLoop | RandomActionLoop) -> Callable[[], Awaitable[int]]:
                async def take() -> int:
                    return loop.collect_batch()

                return take

            def collector_batch(collector: Collector) -> Callable[[], Awaitable[int]]:
                async def take() -> int:
                    return (await anext(collector)).numel()

                return take

            order = [(name, hand_batch(loop)) for name, loop in loops.items()]
            order += [(name, collector_batch(c)) for name, c in collectors.items()]
            for index in range(args.batches):
                # The order rotates too, so no contender always runs right after the same other one.
                shift = index % len(order)
                for name, take in order[shift:] + order[:shift]:
                    started = turns.start()
                    frames = await take()
                    turns.stop(name, frames, started)
    finally:
        for loop in loops.values():
            loop.close()
    return turns


def env_library(workload: str) -> dict[str, str] | None:
    """The version of the library behind the workload's env (and numpy's, which EnvPool is particular about)."""
    from importlib import metadata

    import numpy

    dist = {"envpool": "envpool", "atari": "ale-py"}.get(workload)
    return None if dist is None else {dist: metadata.version(dist), "numpy": numpy.__version__}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workload", choices=WORKLOADS, default="cartpole", help="see the module docstring")
    parser.add_argument("--batches", type=int, default=60, help="timed batches per contender")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per contender first")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--frames-per-batch", type=int, default=2048)
    parser.add_argument("--env-threads", type=int, default=1, help="threads of each EnvPool or ALE vector env")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.frames_per_batch % args.num_envs:
        parser.error(f"--frames-per-batch ({args.frames_per_batch}) must be a multiple of --num-envs")
    single_thread_torch()
    machine = machine_info()
    turns = asyncio.run(measure(args))
    rates = turns.rates()
    reference, goal = REFERENCES[args.workload], GOALS[args.workload]
    print(f"{args.workload}, {args.num_envs} envs, frames_per_batch={args.frames_per_batch}, "
          f"{args.batches} batches each, alternating batch by batch")  # fmt: skip
    print(f"{'what':<54}{'wall frames/s':>15}{'vs ref':>8}{'cpu frames/s':>15}{'vs ref':>8}")
    ref = rates[reference]
    ratios = {}
    for name, r in rates.items():
        ratios[name] = {clock: r[clock] / ref[clock] for clock in ("wall", "cpu")}
        print(
            f"{name:<54}{r['wall']:>15,.0f}{ratios[name]['wall']:>7.2f}x{r['cpu']:>15,.0f}{ratios[name]['cpu']:>7.2f}x"
        )
    print(f"goal: >= {goal}x on both clocks")
    # Against the loop that resets at once too: what acollect adds beyond the cost of handing out no no-op step.
    against_resetting = {
        name: {clock: r[clock] / rates[RESETTING_LOOP][clock] for clock in ("wall", "cpu")}
        for name, r in rates.items()
        if RESETTING_LOOP in rates and name not in (reference, RESETTING_LOOP)
    }
    for name, r in against_resetting.items():
        print(f"{name} vs {RESETTING_LOOP}: {r['wall']:.2f}x wall, {r['cpu']:.2f}x cpu")
    payload = {
        "benchmark": "inprocess_paired",
        "workload": args.workload,
        "env": "pong (ale-py AtariVectorEnv)" if args.workload == "atari" else ENV_ID,
        "reference": reference,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {**machine, "env_library": env_library(args.workload)},
        "turns": turns.as_dict(),
        "ratio_to_reference": {name: r for name, r in ratios.items() if name != reference},
        "ratio_to_resetting_loop": against_resetting or None,
        "goal": goal,
    }
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
