"""Whole episodes: REINFORCE on CartPole-v1 from batches of complete episodes (trajs_per_batch).

Monte Carlo returns need each episode from its reset to its end. ``trajs_per_batch=N`` makes
every batch N complete episodes, ``[N, L]`` padded to the longest with a
``("collector", "mask")`` of the real frames, gathered from whatever worker and batch each
piece came from; the trainer computes the discounted return of every step backwards along
time, masks the padding out, and pushes its weights after each update. Run it with
``python examples/reinforce_episodes.py`` (``--help`` lists the options).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools

import torch
import tyro
from tensordict import TensorDictBase

from acollect import GymEnv, MultiAsyncCollector


@dataclasses.dataclass
class Args:
    num_workers: int = 2
    """worker processes"""
    num_envs: int = 4
    """environments stepped together in each worker"""
    frames_per_batch: int = 256
    """frames each worker collects at a time, underneath the batches of whole episodes"""
    trajs_per_batch: int = 16
    """complete episodes in each batch handed to the trainer"""
    total_frames: int = 153_600
    """frames to collect in all (episodes still running at the end are handed out truncated)"""
    gamma: float = 0.99
    """discount of the Monte Carlo returns"""
    lr: float = 1e-2
    """Adam learning rate"""
    seed: int = 0
    """seed of the envs and the policy"""


class Policy(torch.nn.Module):
    """A 4-32-2 MLP over CartPole's observation; samples an action from its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Categorical(logits=self.net(observation)).sample()


def returns_to_go(reward: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return of every step of ``[N, L]`` episodes (0 on the padding after each one)."""
    out = torch.zeros_like(reward)
    running = torch.zeros(reward.shape[0])
    for t in range(reward.shape[1] - 1, -1, -1):
        running = (reward[:, t] + gamma * running) * mask[:, t]
        out[:, t] = running
    return out


def update(policy: Policy, optim: torch.optim.Optimizer, batch: TensorDictBase, gamma: float) -> float:
    """One policy-gradient step on a batch of whole episodes; returns their mean length."""
    mask = batch["collector", "mask"]
    returns = returns_to_go(batch["next", "reward"].squeeze(-1), mask.float(), gamma)
    real = returns[mask]
    advantage = torch.zeros_like(returns)
    advantage[mask] = (real - real.mean()) / (real.std() + 1e-8)
    logp = torch.log_softmax(policy.net(batch["observation"]), -1)
    logp = logp.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    loss = -(logp * advantage)[mask].sum() / mask.shape[0]
    optim.zero_grad()
    loss.backward()
    optim.step()
    return float(mask.sum(-1).float().mean())


async def main(args: Args) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    policy = Policy()
    optim = torch.optim.Adam(policy.parameters(), lr=args.lr)
    collector = MultiAsyncCollector(
        functools.partial(GymEnv, "CartPole-v1", num_envs=args.num_envs),
        policy,
        num_workers=args.num_workers,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
        trajs_per_batch=args.trajs_per_batch,
    )
    lengths: list[float] = []
    async with collector:
        collector.set_seed(args.seed)
        async for batch in collector:
            assert batch.shape[0] <= args.trajs_per_batch  # N whole episodes (the last batch: those left)
            lengths.append(await asyncio.to_thread(update, policy, optim, batch, args.gamma))
            await collector.update_policy_weights_(policy)
            if len(lengths) % 10 == 0:
                print(f"frames {collector.frames:>8d}  |  mean episode length {lengths[-1]:6.1f}", flush=True)
    last = lengths[-10:]
    print(f"done: {collector.frames} frames, {len(lengths)} updates, last mean episode length "
          f"{sum(last) / len(last):.1f}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
