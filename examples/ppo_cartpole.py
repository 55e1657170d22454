"""On-policy PPO on CartPole-v1: worker processes collect, an async trainer learns, weights go back after each update.

Shows the on-policy loop with worker processes: a ``MultiSyncCollector`` steps
CartPole in 2 worker processes, each running its own copy of the actor (a
``TensorDictModule`` that writes ``"action"`` and its ``"log_prob"``); the trainer
computes advantages with GAE by hand in torch, runs clipped-objective PPO epochs in
a thread (so the event loop keeps hearing the workers' heartbeats), then awaits
``collector.update_policy_weights_(policy)``, which returns once every worker has
the new weights: the next batch is collected by the updated policy only.
Run it with ``python examples/ppo_cartpole.py`` (``--help`` lists the options);
with the defaults, the mean return of the last 100 training episodes reaches 475
well within the 500k frames (see docs/examples.md for a full run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

import torch
import tyro
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from acollect import GymEnv, MultiSyncCollector


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    env_id: str = "CartPole-v1"
    """gymnasium environment id"""
    num_workers: int = 2
    """worker processes"""
    num_envs: int = 8
    """environments stepped together in each worker"""
    frames_per_batch: int = 2048
    """frames per batch from all workers (the PPO rollout size)"""
    total_frames: int = 499_712
    """frames to collect at most (244 batches: the most whole batches within 500k)"""
    target_return: float = 475.0
    """the goal: a mean return of the last 100 training episodes of at least this"""
    stop_at_target: bool = True
    """stop as soon as the goal is reached (otherwise collect all total_frames)"""
    lr: float = 1e-3
    """Adam learning rate at the start; it decays linearly to 0 over total_frames"""
    epochs: int = 10
    """passes over each batch"""
    minibatches: int = 8
    """minibatches per pass"""
    gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip: float = 0.2
    """PPO ratio clipping"""
    ent_coef: float = 0.0
    """entropy bonus weight"""
    vf_coef: float = 0.5
    """value loss weight"""
    max_grad_norm: float = 0.5
    """gradient norm clipping"""
    seed: int = 0
    """seed of envs, networks and sampling"""


def mlp(n_out: int, std: float) -> nn.Sequential:
    """A 4-64-64-n_out Tanh MLP with orthogonal init (a small last layer keeps the first policy near uniform)."""
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))
    for layer, gain in zip(net[::2], (2**0.5, 2**0.5, std), strict=True):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return net


class Actor(nn.Module):
    """Samples a categorical action and returns it with its log-probability (PPO's behaviour log-prob)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(2, 0.01)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = torch.distributions.Categorical(logits=self.net(observation))
        action = dist.sample()
        return action, dist.log_prob(action)


def gae(batch: TensorDictBase, value: torch.Tensor, next_value: torch.Tensor, args: Args) -> torch.Tensor:
    """Advantages over the last (time) dim of ``[n_workers, n_envs, T]`` data.

    ``next_value`` is the value of the real next observation, also at a truncation (CartPole stops at 500
    steps): the return is bootstrapped there, and only a termination zeroes it. ``done`` (either) cuts
    the recursion, so no advantage leaks from one episode into the next.
    """
    reward = batch["next", "reward"].squeeze(-1)
    not_terminated = (~batch["next", "terminated"]).squeeze(-1).float()
    not_done = (~batch["next", "done"]).squeeze(-1).float()
    delta = reward + args.gamma * next_value * not_terminated - value
    adv = torch.zeros_like(delta)
    last = torch.zeros_like(delta[..., 0])
    for t in reversed(range(delta.shape[-1])):
        last = delta[..., t] + args.gamma * args.gae_lambda * not_done[..., t] * last
        adv[..., t] = last
    return adv


class PPO:
    """Clipped-objective PPO on one batch: GAE, then ``epochs`` passes of shuffled minibatches."""

    def __init__(self, actor: Actor, args: Args) -> None:
        self.actor, self.args = actor, args
        self.critic = mlp(1, 1.0)
        self.optim = torch.optim.Adam([*actor.parameters(), *self.critic.parameters()], lr=args.lr, eps=1e-5)

    def update(self, batch: TensorDictBase, progress: float) -> dict[str, float]:
        """Trains on ``batch`` (blocking: run it in a thread); ``progress`` in [0, 1] anneals the learning rate."""
        args = self.args
        for group in self.optim.param_groups:
            group["lr"] = args.lr * (1.0 - progress)
        with torch.no_grad():
            value = self.critic(batch["observation"]).squeeze(-1)
            next_value = self.critic(batch["next", "observation"]).squeeze(-1)
            adv = gae(batch, value, next_value, args)
            returns = adv + value
        # Flatten [n_workers, n_envs, T] into one axis of transitions: PPO's minibatches ignore the layout.
        obs, action = batch["observation"].reshape(-1, 4), batch["action"].reshape(-1)
        old_logp, adv, returns = batch["log_prob"].reshape(-1), adv.reshape(-1), returns.reshape(-1)
        n = obs.shape[0]
        size = n // args.minibatches
        for _ in range(args.epochs):
            order = torch.randperm(n)
            for start in range(0, n - size + 1, size):
                idx = order[start : start + size]
                dist = torch.distributions.Categorical(logits=self.actor.net(obs[idx]))
                logp = dist.log_prob(action[idx])
                mb_adv = adv[idx]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                ratio = (logp - old_logp[idx]).exp()
                pg_loss = -torch.min(ratio * mb_adv, ratio.clamp(1 - args.clip, 1 + args.clip) * mb_adv).mean()
                v_loss = 0.5 * (self.critic(obs[idx]).squeeze(-1) - returns[idx]).pow(2).mean()
                loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * dist.entropy().mean()
                self.optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_([*self.actor.parameters(), *self.critic.parameters()], args.max_grad_norm)
                self.optim.step()
        return {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "entropy": dist.entropy().mean().item()}


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # tiny networks: more threads only fight the workers for the cores
    actor = Actor()
    # The workers get a copy of this module; out_keys put the behaviour log-prob into every batch.
    policy = TensorDictModule(actor, in_keys=["observation"], out_keys=["action", "log_prob"])
    ppo = PPO(actor, args)
    collector = MultiSyncCollector(
        functools.partial(GymEnv, args.env_id, num_envs=args.num_envs),
        policy,
        num_workers=args.num_workers,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
    )
    start, reached = time.monotonic(), None
    async with collector:
        collector.set_seed(args.seed)
        async for batch in collector:
            progress = min(1.0, collector.frames / args.total_frames)
            # Training in a thread keeps the event loop free: worker heartbeats and messages are heard meanwhile.
            info = await asyncio.to_thread(ppo.update, batch, progress)
            version = await collector.update_policy_weights_(policy)  # every worker has it: the next batch is on-policy
            stats = collector.stats()
            mean = stats.episode_return_mean or 0.0
            print(
                f"frames {collector.frames:7d}  episodes {stats.episodes:5d}  return (last 100) {mean:6.1f}  "
                f"entropy {info['entropy']:.3f}  v_loss {info['v_loss']:7.3f}  policy v{version}  "
                f"{collector.frames / (time.monotonic() - start):6.0f} frames/s",
                flush=True,
            )
            if reached is None and stats.episodes >= 100 and mean >= args.target_return:
                reached = collector.frames
                if args.stop_at_target:
                    break
    stats = collector.stats()
    outcome = (
        f"reached {args.target_return:g} at {reached} frames" if reached else f"did not reach {args.target_return:g}"
    )
    print(
        f"done: {outcome}; {stats.frames} frames in {time.monotonic() - start:.0f}s; mean return of the last 100 "
        f"training episodes {stats.episode_return_mean or 0:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
