"""Off-policy SAC on Pendulum-v1 (or a MuJoCo env): a background collector fills a replay buffer for an async trainer.

Shows continuous control: a ``Collector`` steps the envs in its thread with its own
copy of a tanh-squashed Gaussian actor (its actions always within the env's bounds,
scaled from ``[-1, 1]``) and fills acollect's ``ReplayBuffer`` in the background
(``collector.start(rb, frames_per_update=...)``), while the trainer samples
minibatches for soft actor-critic (twin Q-networks with Polyak-averaged targets, and
the entropy temperature tuned to a target entropy) and pushes the actor's weights
back every few updates. ``await collector.trained()`` holds the replay ratio, so the
curve does not depend on the machine's speed. Every ``--eval-every`` frames, the
deterministic policy (the mean action) plays a few episodes inside
``collector.pause()``, and a line gives frames, wall time and mean return.
Run it with ``python examples/pendulum_sac.py`` (``--help`` lists the options); with the
defaults the mean return rises from about -1,400 to about -150 within 12,288 frames
(docs/examples.md has a run). ``--env-id HalfCheetah-v5`` runs a MuJoCo env with the
``mujoco`` extra (``pip install 'acollect[mujoco]'``): its float64 observations come as
float32, which is what the networks take.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time

import gymnasium as gym
import numpy as np
import torch
import tyro
from tensordict import TensorDictBase
from torch import nn

from acollect import Collector, GymEnv, ReplayBuffer


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    env_id: str = "Pendulum-v1"
    """gymnasium environment id with a Box action space (HalfCheetah-v5 needs the mujoco extra)"""
    total_frames: int = 12_288
    """env frames to collect in all (the run ends when they are collected)"""
    num_envs: int = 4
    """environments stepped together by the collector"""
    frames_per_batch: int = 64
    """frames per collected batch (each one lands in the replay buffer at once)"""
    buffer_size: int = 100_000
    """replay buffer capacity (transitions)"""
    learning_starts: int = 1_024
    """frames of uniformly random actions collected before the first update"""
    frames_per_update: float = 1.0
    """frames collected per gradient step (the replay ratio is kept there, whatever the machine's speed)"""
    max_lead: int = 256
    """frames the collector may run ahead of that ratio before it waits for the trainer"""
    batch_size: int = 256
    """transitions per sampled minibatch"""
    hidden: int = 128
    """width of the two hidden layers of the actor and of each Q-network"""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor and of the entropy temperature"""
    critic_lr: float = 1e-3
    """Adam learning rate of the Q-networks"""
    gamma: float = 0.99
    """discount"""
    tau: float = 0.005
    """Polyak step of the target Q-networks per update"""
    push_every: int = 32
    """gradient steps between weight pushes to the collector"""
    eval_every: int = 1_024
    """frames between evaluations (and lines of the learning curve)"""
    eval_episodes: int = 4
    """deterministic episodes per evaluation"""
    seed: int = 0
    """seed of envs, networks and sampling"""


def mlp(n_in: int, n_out: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out)
    )


class Actor(nn.Module):
    """A tanh-squashed Gaussian, scaled to the action bounds. Called with observations, it samples an action
    (what the collector stores); :meth:`sample` also gives its log-probability, :meth:`mean_action` the mode."""

    scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, n_obs: int, low: np.ndarray, high: np.ndarray, hidden: int) -> None:
        super().__init__()
        self.net = mlp(n_obs, 2 * len(low), hidden)
        # Buffers, not parameters: they travel with the weights to the collector, and no optimiser moves them.
        self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2, dtype=torch.float32))

    def _mean_log_std(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(observation).chunk(2, dim=-1)
        return mean, log_std.clamp(-5.0, 2.0)

    def sample(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # By hand rather than with torch.distributions: its argument checks cost more than the tiny networks.
        mean, log_std = self._mean_log_std(observation)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        # The density of tanh(u), scaled: the Gaussian's, less log |d action / d u| (in a numerically stable form).
        log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * np.log(2 * np.pi)
        log_prob = log_prob - 2 * (np.log(2) - u - nn.functional.softplus(-2 * u))
        return torch.tanh(u) * self.scale + self.bias, log_prob.sum(-1, keepdim=True) - self.scale.log().sum()

    def mean_action(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self._mean_log_std(observation)[0]) * self.scale + self.bias

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.sample(observation)[0]


class SAC:
    """Soft actor-critic: twin Q-networks with Polyak targets, and the entropy temperature tuned automatically."""

    def __init__(self, actor: Actor, n_obs: int, n_act: int, args: Args) -> None:
        self.actor, self.args = actor, args
        self.q = nn.ModuleList([mlp(n_obs + n_act, 1, args.hidden) for _ in range(2)])
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.target_entropy = -float(n_act)
        self.q_optim = torch.optim.Adam(self.q.parameters(), lr=args.critic_lr)
        self.actor_optim = torch.optim.Adam(actor.parameters(), lr=args.actor_lr)
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=args.actor_lr)
        self.steps = 0

    def _min_q(self, nets: nn.ModuleList, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], -1)
        return torch.min(nets[0](x), nets[1](x))

    def update(self, data: TensorDictBase) -> float:
        """One gradient step of critics, actor and temperature on ``data``; returns the critic loss."""
        obs, action = data["observation"], data["action"]
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(data["next", "observation"])
            next_q = self._min_q(self.q_target, data["next", "observation"], next_action) - alpha * next_log_prob
            # A truncated episode (Pendulum's 200 steps) bootstraps from its true final observation.
            y = data["next", "reward"] + self.args.gamma * next_q * (~data["next", "terminated"])
        x = torch.cat([obs, action], -1)
        q_loss = nn.functional.mse_loss(self.q[0](x), y) + nn.functional.mse_loss(self.q[1](x), y)
        self.q_optim.zero_grad()
        q_loss.backward()
        self.q_optim.step()

        new_action, log_prob = self.actor.sample(obs)
        actor_loss = (alpha * log_prob - self._min_q(self.q, obs, new_action)).mean()
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_optim.zero_grad()
        alpha_loss.backward()
        self.alpha_optim.step()

        with torch.no_grad():
            target: list[torch.Tensor] = list(self.q_target.parameters())
            torch._foreach_lerp_(target, list(self.q.parameters()), self.args.tau)
        self.steps += 1
        return q_loss.item()


def evaluate(actor: Actor, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of the deterministic policy over ``episodes`` episodes (blocking: run it in a thread)."""
    envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while running.any():
            action = actor.mean_action(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            obs, reward, terminated, truncated, _ = envs.step(action)
            returns += reward * running
            running &= ~(terminated | truncated)
    envs.close()
    return float(returns.mean())


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small networks: more intra-op threads only fight the collector's thread for cores
    with gym.make(args.env_id) as spec_env:
        obs_space, act_space = spec_env.observation_space, spec_env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, gym.spaces.Box):
        raise SystemExit(f"--env-id {args.env_id}: SAC here takes Box observations and actions, not {act_space}")
    n_obs, n_act = obs_space.shape[0], act_space.shape[0]
    low, high = act_space.low, act_space.high

    def make_actor() -> Actor:
        return Actor(n_obs, low, high, args.hidden)

    actor = make_actor()
    sac = SAC(actor, n_obs, n_act, args)
    rb = ReplayBuffer(args.buffer_size)
    # The collector runs its own copy of the actor (policy_factory), so training never races it; the first
    # learning_starts frames are uniformly random actions.
    collector = Collector(
        lambda: GymEnv(args.env_id, num_envs=args.num_envs),
        policy_factory=make_actor,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
        init_random_frames=args.learning_starts,
    )

    start = time.monotonic()
    next_eval = args.eval_every
    score = float("nan")
    async with collector:
        collector.set_seed(args.seed)
        await collector.update_policy_weights_(actor)
        collector.start(rb, frames_per_update=args.frames_per_update, learning_starts=args.learning_starts,
                        max_frames_ahead=args.max_lead)  # fmt: skip
        await collector.trained(updates=0)  # the warm-up is in the buffer
        while not collector.exhausted:
            loss = sac.update(rb.sample(args.batch_size))
            if sac.steps % args.push_every == 0:
                await collector.update_policy_weights_(actor)  # applied from the collector's next batch
            if collector.frames >= next_eval:
                next_eval = (collector.frames // args.eval_every + 1) * args.eval_every
                # Paused, the collector steps no env: the evaluation has the CPU, and the buffer stands still.
                async with collector.pause():
                    policy = copy.deepcopy(actor)
                    score = await asyncio.to_thread(evaluate, policy, args.env_id, args.eval_episodes, sac.steps)
                stats = collector.stats()
                print(
                    f"frames {collector.frames:7d}  wall {time.monotonic() - start:5.0f}s  updates {sac.steps:6d}  "
                    f"eval return {score:8.1f}  train return (last 100 episodes) "
                    f"{stats.episode_return_mean or float('nan'):8.1f}  alpha {sac.log_alpha.exp().item():.3f}  "
                    f"critic loss {loss:.3f}",
                    flush=True,
                )
            await collector.trained(updates=1)  # one more update: returns once the next one's frames are in
    print(
        f"done: {collector.frames} frames, {sac.steps} updates in {time.monotonic() - start:.0f}s; last eval return "
        f"{score:.1f} (mean of {args.eval_episodes} deterministic episodes)"
    )


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
