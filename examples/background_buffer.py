"""Background collection: a started collector fills a replay buffer while an async trainer samples it.

Shows ``collector.start(replay_buffer=rb)``, an async trainer that samples from
the buffer in the same event loop, weight pushes after each update, and
``pause()`` around an evaluation (the buffer does not grow inside it).
Run it with ``python examples/background_buffer.py`` (``--help`` lists the options).
"""

from __future__ import annotations

import asyncio
import dataclasses

import torch
import tyro

from acollect import Collector, GymEnv, ReplayBuffer
from acollect.testing import wait_until


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    num_envs: int = 8
    """environments stepped together"""
    frames_per_batch: int = 256
    """frames per collected batch"""
    buffer_size: int = 50_000
    """replay buffer capacity (transitions)"""
    train_steps: int = 200
    """gradient steps of the toy trainer"""
    batch_size: int = 128
    """transitions per sampled minibatch"""
    seed: int = 0
    """seed of envs and policy"""


class QPolicy(torch.nn.Module):
    """Epsilon-greedy over a small Q-network."""

    def __init__(self, epsilon: float = 0.1) -> None:
        super().__init__()
        self.q = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        self.epsilon = epsilon

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        greedy = self.q(observation).argmax(-1)
        explore = torch.rand(greedy.shape) < self.epsilon
        return torch.where(explore, torch.randint_like(greedy, 2), greedy)


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    learner = QPolicy()
    target = QPolicy()
    target.load_state_dict(learner.state_dict())
    optim = torch.optim.Adam(learner.parameters(), lr=1e-3)
    rb = ReplayBuffer(args.buffer_size)

    # The collector runs its own copy of the policy (policy_factory), so training never races it.
    async with Collector(
        lambda: GymEnv("CartPole-v1", num_envs=args.num_envs),
        policy_factory=QPolicy,
        frames_per_batch=args.frames_per_batch,
    ) as collector:
        collector.set_seed(args.seed)
        await collector.update_policy_weights_(learner)
        collector.start(replay_buffer=rb)
        await wait_until(lambda: len(rb) >= 4 * args.batch_size, timeout=60)

        for step in range(1, args.train_steps + 1):
            data = rb.sample(args.batch_size)
            q = learner.q(data["observation"]).gather(-1, data["action"].unsqueeze(-1))
            with torch.no_grad():
                nxt = target.q(data["next", "observation"]).max(-1, keepdim=True).values
                y = data["next", "reward"] + 0.99 * nxt * (~data["next", "terminated"])
            loss = torch.nn.functional.smooth_l1_loss(q, y)
            optim.zero_grad()
            loss.backward()
            optim.step()
            if step % 50 == 0:
                target.load_state_dict(learner.state_dict())
                await collector.update_policy_weights_(learner)
                async with collector.pause():
                    size = len(rb)
                    await asyncio.sleep(0.05)  # e.g. an evaluation: the buffer does not grow meanwhile
                    assert len(rb) == size
                print(
                    f"step {step:4d}  loss {loss.item():.4f}  buffer {len(rb):6d}  "
                    f"frames {collector.frames:6d}  policy v{collector.policy_version}",
                    flush=True,
                )
            await asyncio.sleep(0)  # let the collector hand its batches over
    print(f"done: {collector.frames} frames collected in the background")


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
