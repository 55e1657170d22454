"""Central inference: env workers only step, one batched forward pass (on the GPU if there is one) chooses every action.

Shows ``AsyncBatchedCollector`` feeding a small policy-gradient trainer, weight pushes into the inference
server between two forward passes, the per-step ``("collector", "policy_version")``, an evaluation task that
asks the same server for actions with ``await collector.server.infer(td)``, and the server's statistics
(batch fill rate, latency). Run it with ``python examples/central_inference.py`` (``--help`` lists the options).
"""

from __future__ import annotations

import dataclasses

import anyio
import gymnasium as gym
import torch
import tyro
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import AsyncBatchedCollector


@dataclasses.dataclass
class Args:
    num_workers: int = 2
    """env worker processes"""
    envs_per_worker: int = 8
    """CartPole envs stepped by each worker"""
    frames_per_batch: int = 1024
    """frames per batch (one worker's batch)"""
    total_frames: int = 16_384
    """frames to collect in all"""
    hidden: int = 256
    """width of the policy's two hidden layers"""
    max_wait: float = 0.002
    """seconds an observation may wait for others to share its forward pass"""
    device: str = "auto"
    """where the inference server runs the policy: cpu, cuda, or auto (cuda if there is one)"""
    lr: float = 3e-3
    """learning rate of the policy-gradient trainer"""


class Actor(torch.nn.Module):
    """Observation in; sampled action and its log-probability out."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, 2),
        )  # fmt: skip

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = torch.distributions.Categorical(logits=self.net(observation))
        action = dist.sample()
        return action, dist.log_prob(action)


def returns_to_go(reward: torch.Tensor, done: torch.Tensor, gamma: float = 0.99) -> torch.Tensor:
    """Discounted returns within each env's row ``[n_envs, T]``, cut at episode ends (and at the batch end)."""
    out = torch.zeros_like(reward)
    running = torch.zeros(reward.shape[0])
    for t in reversed(range(reward.shape[1])):
        running = reward[:, t] + gamma * running * (~done[:, t]).float()
        out[:, t] = running
    return out


async def evaluate(collector: AsyncBatchedCollector, episodes: int = 4) -> float:
    """Plays CartPole in this process, asking the collector's inference server for each action."""
    env = gym.make("CartPole-v1")
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=1000 + episode)
        done = False
        while not done:
            td = TensorDict({"observation": torch.as_tensor(obs, dtype=torch.float32)}, [])
            action = int((await collector.server.infer(td))["action"])  # batched with the workers' steps
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


async def main(args: Args) -> None:
    torch.manual_seed(0)
    actor = Actor(args.hidden)
    policy = TensorDictModule(actor, in_keys=["observation"], out_keys=["action", "sample_log_prob"])
    optim = torch.optim.Adam(actor.parameters(), lr=args.lr)
    async with AsyncBatchedCollector(
        "CartPole-v1",
        policy,
        num_workers=args.num_workers,
        env_kwargs={"num_envs": args.envs_per_worker},
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
        max_wait=args.max_wait,
        device=("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device,
    ) as collector:
        print(f"eval return before training: {await evaluate(collector):.1f}")
        async for batch in collector:
            # REINFORCE on the batch: the log-probabilities are recomputed with the trained copy.
            logits = actor.net(batch["observation"])
            log_prob = torch.distributions.Categorical(logits=logits).log_prob(batch["action"])
            ret = returns_to_go(batch["next", "reward"].squeeze(-1), batch["next", "done"].squeeze(-1))
            loss = -(log_prob * (ret - ret.mean()) / (ret.std() + 1e-6)).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            version = await collector.update_policy_weights_(actor)  # one copy into the server, between passes
            versions = batch["collector", "policy_version"]
            stats = collector.stats()
            print(
                f"{stats.frames:>7,} frames  return {stats.episode_return_mean or 0:6.1f}  actions by versions "
                f"{int(versions.min())}-{int(versions.max())}, now {version}  server batch "
                f"{stats.inference['mean_batch_size']:.1f} (fill {stats.inference['fill_rate']:.0%})"
            )
        print(f"eval return after training: {await evaluate(collector):.1f}")
        print("done:", collector.stats())


if __name__ == "__main__":
    anyio.run(main, tyro.cli(Args, description=__doc__.splitlines()[0]))
