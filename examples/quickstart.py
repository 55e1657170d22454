"""Quickstart: collect CartPole-v1 frames in 2 worker processes with a small MLP policy; print live frames/s.

Shows the core loop of acollect: build a collector, ``async for`` its batches,
and read the TorchRL-compatible batch layout. Envs and policy copies run in
worker processes; each batch stacks the workers' ``[n_envs, T]`` batches. Run it with
``python examples/quickstart.py`` (``--help`` lists the options).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

import torch
import tyro

from acollect import GymEnv, MultiSyncCollector


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    env_id: str = "CartPole-v1"
    """gymnasium environment id"""
    num_workers: int = 2
    """worker processes"""
    num_envs: int = 16
    """environments stepped together in each worker (one vector env per worker)"""
    frames_per_batch: int = 2048
    """frames in each batch"""
    total_frames: int = 102_400
    """frames to collect in all (a multiple of frames_per_batch: the last batch ends there)"""
    seed: int = 0
    """seed of the envs and the policy"""


class MLPPolicy(torch.nn.Module):
    """A 4-64-64-2 MLP that samples a categorical action from its logits."""

    def __init__(self, n_obs: int = 4, n_actions: int = 2) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_obs, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, n_actions),
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.net(observation), dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)


async def main(args: Args) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    collector = MultiSyncCollector(
        functools.partial(GymEnv, args.env_id, num_envs=args.num_envs),
        MLPPolicy(),
        num_workers=args.num_workers,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
    )
    async with collector:
        collector.set_seed(args.seed)
        start = time.perf_counter()
        async for batch in collector:
            elapsed = time.perf_counter() - start
            episodes = int(batch["next", "done"].sum())
            print(
                f"frames {collector.frames:>8d}  |  {collector.frames / elapsed:>8.0f} frames/s  |  "
                f"batch {tuple(batch.shape)}  |  episodes ended {episodes}",
                flush=True,
            )
    print(f"collected {collector.frames} frames in {time.perf_counter() - start:.2f}s")


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
