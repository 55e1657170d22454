"""Off-policy DQN on CartPole-v1: a started collector fills a replay buffer while an async trainer samples it.

Shows background collection feeding an off-policy learner in one event loop:
``collector.start(replay_buffer=rb)`` steps envs in the collector's thread while
the trainer samples minibatches from ``rb``, holding a replay ratio of one gradient
update per ``frames_per_update`` frames (``collector.start(rb, frames_per_update=...)``
and ``await collector.trained()``: neither side runs ahead of the other, so the
learning curve does not depend on the machine's speed); the trainer pushes its
weights (and its exploration rate, a buffer of the policy module) every few updates;
an evaluation runs inside ``async with collector.pause()``; ``collector.stats()``
reports the training episodes' returns. Double DQN with a target network.
Run it with ``python examples/dqn_cartpole.py`` (``--help`` lists the options);
with the defaults (102,400 frames, 50,560 updates, about 80 s on 2 quiet cores) the greedy policy
reaches CartPole's maximum return of 500 during the run; its final evaluation gave 500.0 (seed 0) on a
quiet machine and 219.4 in a run on a loaded one (which buffer contents a sample sees still depends on
the machine's timing within the ratio's bounds, and DQN's greedy policy swings between evaluations).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time

import gymnasium as gym
import torch
import tyro
from tensordict import TensorDictBase
from torch import nn

from acollect import Collector, GymEnv, ReplayBuffer


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    total_frames: int = 102_400
    """env frames to collect in all (the run ends when they are collected)"""
    num_envs: int = 8
    """environments stepped together by the collector"""
    frames_per_batch: int = 256
    """frames per collected batch (each one lands in the replay buffer at once)"""
    buffer_size: int = 50_000
    """replay buffer capacity (transitions)"""
    learning_starts: int = 1_024
    """frames collected before the first update"""
    frames_per_update: int = 2
    """frames collected per gradient step (the replay ratio is kept there, whatever the machine's speed)"""
    max_lead: int = 512
    """frames the collector may run ahead of that ratio before it waits for the trainer"""
    batch_size: int = 64
    """transitions per sampled minibatch"""
    lr: float = 1e-3
    """Adam learning rate at the start; it decays linearly to 0 over the run, which steadies the end of it"""
    gamma: float = 0.99
    """discount"""
    target_every: int = 250
    """gradient steps between target-network copies"""
    push_every: int = 50
    """gradient steps between weight pushes to the collector"""
    eps_start: float = 1.0
    """exploration rate at the start"""
    eps_end: float = 0.04
    """exploration rate at the end of the decay"""
    eps_decay_frames: int = 10_000
    """frames over which the exploration rate decays linearly"""
    eval_every: int = 8_000
    """gradient steps between evaluations"""
    eval_episodes: int = 10
    """greedy episodes per evaluation"""
    seed: int = 0
    """seed of envs, network and sampling"""


class QPolicy(nn.Module):
    """Epsilon-greedy over a Q-network. ``epsilon`` is a buffer, so weight pushes carry it to the collector."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
        self.register_buffer("epsilon", torch.tensor(1.0))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        greedy = self.q(observation).argmax(-1)
        explore = torch.rand(greedy.shape) < self.epsilon
        return torch.where(explore, torch.randint_like(greedy, 2), greedy)


def evaluate(q: nn.Module, episodes: int, seed: int) -> float:
    """Mean return of the greedy policy over ``episodes`` episodes (blocking: run it in a thread)."""
    envs = gym.make_vec("CartPole-v1", num_envs=episodes, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed)
    returns = torch.zeros(episodes)
    running = torch.ones(episodes, dtype=torch.bool)
    with torch.no_grad():
        while running.any():
            action = q(torch.as_tensor(obs)).argmax(-1)
            obs, reward, terminated, truncated, _ = envs.step(action.numpy())
            returns += torch.as_tensor(reward, dtype=torch.float32) * running
            running &= ~torch.as_tensor(terminated | truncated)
    envs.close()
    return float(returns.mean())


class DQN:
    """Double DQN: the online net picks the next action, a periodically copied target net values it."""

    def __init__(self, learner: QPolicy, args: Args) -> None:
        self.learner, self.args = learner, args
        self.target = copy.deepcopy(learner.q)
        self.optim = torch.optim.Adam(learner.q.parameters(), lr=args.lr)
        self.steps = 0

    def update(self, data: TensorDictBase, progress: float) -> float:
        """One gradient step on ``data``; ``progress`` in [0, 1] is how far the run is."""
        for group in self.optim.param_groups:
            group["lr"] = self.args.lr * (1.0 - progress)
        q_net = self.learner.q
        q = q_net(data["observation"]).gather(-1, data["action"].unsqueeze(-1))
        with torch.no_grad():
            best = q_net(data["next", "observation"]).argmax(-1, keepdim=True)
            nxt = self.target(data["next", "observation"]).gather(-1, best)
            y = data["next", "reward"] + self.args.gamma * nxt * (~data["next", "terminated"])
        loss = nn.functional.smooth_l1_loss(q, y)
        self.optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
        self.optim.step()
        self.steps += 1
        if self.steps % self.args.target_every == 0:
            self.target.load_state_dict(q_net.state_dict())
        return loss.item()


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # tiny networks: more intra-op threads only fight the collector's thread for cores
    learner = QPolicy()
    dqn = DQN(learner, args)
    rb = ReplayBuffer(args.buffer_size)

    # The collector runs its own copy of the policy (policy_factory), so training never races it.
    collector = Collector(
        lambda: GymEnv("CartPole-v1", num_envs=args.num_envs),
        policy_factory=QPolicy,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
    )

    async def train_step() -> None:
        loss = dqn.update(rb.sample(args.batch_size), min(1.0, collector.frames / args.total_frames))
        if dqn.steps % args.push_every == 0:
            fraction = min(1.0, collector.frames / args.eps_decay_frames)
            learner.epsilon.fill_(args.eps_start + fraction * (args.eps_end - args.eps_start))
            await collector.update_policy_weights_(learner)  # applied from the collector's next batch
        if dqn.steps % args.eval_every == 0:
            # Paused, the collector steps no env: the evaluation has the CPU, and the buffer stands still.
            async with collector.pause():
                score = await asyncio.to_thread(evaluate, copy.deepcopy(learner.q), args.eval_episodes, dqn.steps)
            stats = collector.stats()
            print(
                f"step {dqn.steps:6d}  frames {stats.frames:7d}  eps {float(learner.epsilon):.2f}  "
                f"train return {stats.episode_return_mean or 0:6.1f}  eval return {score:6.1f}  loss {loss:.3f}  "
                f"policy lag {stats.policy_lag[0]}",
                flush=True,
            )

    start = time.monotonic()
    async with collector:
        collector.set_seed(args.seed)
        await collector.update_policy_weights_(learner)
        # The replay ratio: the collector waits when it is max_lead frames ahead of one update per
        # frames_per_update frames, and trained() waits until the frames of the next update are in.
        collector.start(rb, frames_per_update=args.frames_per_update, learning_starts=args.learning_starts,
                        max_frames_ahead=args.max_lead)  # fmt: skip
        await collector.trained(updates=0)  # the warm-up is in the buffer
        while not collector.exhausted:
            await train_step()
            await collector.trained(updates=1)  # one more update: returns once the next one's frames are in
        async with collector.pause():
            final = await asyncio.to_thread(evaluate, learner.q, args.eval_episodes, args.seed + 1)
    stats = collector.stats()
    print(
        f"done: {stats.frames} frames, {dqn.steps} updates in {time.monotonic() - start:.0f}s; final eval return "
        f"{final:.1f} (mean of {args.eval_episodes} greedy episodes); last 100 training episodes "
        f"{stats.episode_return_mean or 0:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
