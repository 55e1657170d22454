"""Ray cluster: collect CartPole-v1 with RayCollector, each remote collector a Ray actor; train and push weights.

The trainer runs here; each remote collector is a Ray actor (on any node of the cluster)
that steps a vector env with its copy of the policy and sends its batches straight to
this process over tcp. After every batch the trainer takes one REINFORCE step and pushes
the new weights; every batch says which weights collected it.

Without ``--address`` a local Ray cluster is started (``--num-cpus`` CPUs); with
``--address auto`` (or ``ray://...``) the collector joins a running one. Run it with
``python examples/ray_cluster.py`` (``--help`` lists the options).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

import torch
import tyro

from acollect import RayCollector
from acollect.envs import GymEnv


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    num_collectors: int = 2
    """remote collectors, one Ray actor each"""
    num_envs: int = 8
    """environments stepped together in each actor"""
    frames_per_batch: int = 1024
    """frames in each batch, from all collectors together"""
    total_frames: int = 20_480
    """frames to collect in all"""
    lr: float = 0.01
    """learning rate of the REINFORCE step"""
    address: str = ""
    """a running cluster to join ("auto", "ray://host:10001"); empty: start a local one"""
    num_cpus: int = 2
    """CPUs of the local cluster (one per actor)"""
    seed: int = 0
    """seed of the envs and the policy"""


class MLPPolicy(torch.nn.Module):
    """A 4-64-2 MLP that samples a categorical action from its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(self.net(observation), dim=-1), 1).squeeze(-1)


def reinforce_loss(policy: MLPPolicy, batch: torch.Tensor) -> torch.Tensor:
    """Log-probability of each action times its reward-to-go within the batch (cut at episode ends)."""
    rewards = batch["next", "reward"].squeeze(-1).flatten(0, -2)  # [envs, T]
    done = batch["next", "done"].squeeze(-1).flatten(0, -2)
    to_go = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[:, t] + 0.99 * running * (~done[:, t])
        to_go[:, t] = running
    to_go = (to_go - to_go.mean()) / (to_go.std() + 1e-8)
    logits = policy.net(batch["observation"].flatten(0, -3))
    logp = torch.log_softmax(logits, -1).gather(-1, batch["action"].flatten(0, -2).unsqueeze(-1)).squeeze(-1)
    return -(logp * to_go).mean()


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    policy = MLPPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    ray_init = {"address": args.address} if args.address else {"num_cpus": args.num_cpus, "include_dashboard": False}
    collector = RayCollector(
        functools.partial(GymEnv, "CartPole-v1", num_envs=args.num_envs),
        policy,
        num_collectors=args.num_collectors,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
        sync=True,  # one batch stacked from every collector: [num_collectors, num_envs, T]
        ray_init_config=ray_init,
        remote_configs={"num_cpus": 1},
        # The cluster this example started ends with the collector; one given with --address stays up.
        shutdown_ray=not args.address,
    )
    start = time.perf_counter()
    async with collector:
        collector.set_seed(args.seed)
        print(f"{args.num_collectors} actors: {len(collector.remote_collectors)} started")
        async for batch in collector:
            loss = reinforce_loss(policy, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            version = await collector.update_policy_weights_(policy)  # returns once every actor has them
            stats = collector.stats()
            mean = "-" if stats.episode_return_mean is None else f"{stats.episode_return_mean:.1f}"
            print(f"frames {stats.frames:>7}  batch {tuple(batch.shape)}  weights v{version}  "
                  f"mean return {mean:>6}  {stats.frames_per_s:,.0f} frames/s")  # fmt: skip
    print(f"done: {collector.frames} frames in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
