"""MAPPO on VMAS navigation: three agents, one shared policy, a centralised critic, batches from a TorchRL env.

Shows a multi-agent env with nested keys going through a collector: a TorchRL
``VmasEnv`` (navigation: each of 3 agents must reach its own goal without hitting
the others) steps 60 vectorised scenarios in one ``Collector``, in-process, and
every batch is ``[n_envs, T]`` with the agents' leaves under ``"agents"``:
``("agents", "observation")``, ``("agents", "action")``, ``("next", "agents", "reward")``.
The policy is TorchRL's: a ``MultiAgentMLP`` whose parameters all agents share,
each agent acting on its own observation (decentralised execution), a tanh-squashed
Gaussian over the continuous actions; the critic is a ``MultiAgentMLP`` that sees
every agent's observation (centralised training). ``ClipPPOLoss`` with GAE trains
both on each batch in a thread; ``collector.update_policy_weights_(policy)`` then
hands the new weights to the rollout, so each batch is on-policy.
Run it with ``python examples/mappo.py`` (``--help`` lists the options); it needs
TorchRL and VMAS (``pip install -e '.[marl]'``). With the defaults (240k
frames, about 3 minutes on 2 cores), the mean return of the last 100 episodes goes
from -1 to about 9 and the episodes get shorter as the agents reach their goals
sooner (see docs/examples.md for a full run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import torch
import tyro
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.envs.libs.vmas import VmasEnv
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal
from torchrl.objectives import ClipPPOLoss, ValueEstimators

from acollect import Collector


# The command line: tyro.cli(Args) makes a --flag per field, with the field's docstring and default as its help.
@dataclasses.dataclass
class Args:
    n_agents: int = 3
    """agents, all in one group sharing the policy's parameters"""
    max_steps: int = 100
    """steps per episode at most (it ends sooner once every agent is on its goal)"""
    num_envs: int = 60
    """scenarios VMAS steps together, in one batched torch call"""
    frames_per_batch: int = 6000
    """frames (env steps, each of every agent) per batch: the PPO rollout"""
    total_frames: int = 240_000
    """frames to collect (40 batches)"""
    epochs: int = 10
    """passes over each batch"""
    minibatch_size: int = 400
    """frames per minibatch"""
    lr: float = 3e-4
    """Adam learning rate"""
    hidden: int = 256
    """width of the two hidden layers of the policy and critic MLPs"""
    gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.9
    """GAE lambda"""
    clip: float = 0.2
    """PPO ratio clipping"""
    ent_coef: float = 1e-4
    """entropy bonus weight"""
    max_grad_norm: float = 1.0
    """gradient norm clipping"""
    seed: int = 0
    """seed of envs, networks and sampling"""


def make_env(args: Args) -> VmasEnv:
    """The TorchRL env: one batch dim of ``num_envs`` scenarios, the agents' keys under ``"agents"``."""
    return VmasEnv(
        "navigation",
        num_envs=args.num_envs,
        continuous_actions=True,
        max_steps=args.max_steps,
        n_agents=args.n_agents,
        device="cpu",
        seed=args.seed,
    )


def make_agents(env: VmasEnv, args: Args) -> tuple[ProbabilisticActor, TensorDictModule, str]:
    """The shared decentralised policy, the centralised critic, and the name of the agents' group."""
    ((group, _),) = env.action_keys  # one group of identical agents: ("agents", "action") for VMAS
    obs_dim = env.observation_spec[group, "observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched[group, "action"]
    n_agents, action_dim = action_spec.shape[-2:]
    # Each agent maps its own observation to the mean and scale of its action: one set of weights for all
    # agents (share_params), none of them seeing another's observation (centralized=False).
    net = nn.Sequential(
        MultiAgentMLP(
            n_agent_inputs=obs_dim,
            n_agent_outputs=2 * action_dim,
            n_agents=n_agents,
            centralized=False,
            share_params=True,
            depth=2,
            num_cells=args.hidden,
            activation_class=nn.Tanh,
        ),
        NormalParamExtractor(),  # splits the last dim into loc and a positive scale
    )
    params = TensorDictModule(net, in_keys=[(group, "observation")], out_keys=[(group, "loc"), (group, "scale")])
    policy = ProbabilisticActor(
        params,
        in_keys=[(group, "loc"), (group, "scale")],
        out_keys=[(group, "action")],
        distribution_class=TanhNormal,
        # The tanh squashes samples into the env's bounds, so no action is ever clipped by the env.
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=True,  # the behaviour log-prob, for PPO's ratio
    )
    # The critic values the state from all agents' observations (centralised training). Navigation's reward is
    # the team's by default, the same for every agent, so one shared set of weights can value it for all.
    critic = TensorDictModule(
        MultiAgentMLP(
            n_agent_inputs=obs_dim,
            n_agent_outputs=1,
            n_agents=n_agents,
            centralized=True,
            share_params=True,
            depth=2,
            num_cells=args.hidden,
            activation_class=nn.Tanh,
        ),
        in_keys=[(group, "observation")],
        out_keys=[(group, "state_value")],
    )
    return policy, critic, group


class MAPPO:
    """TorchRL's clipped PPO loss with GAE, keyed to one group of agents."""

    def __init__(self, policy: ProbabilisticActor, critic: TensorDictModule, group: str, args: Args) -> None:
        self.group, self.args = group, args
        self.loss = ClipPPOLoss(
            actor_network=policy,
            critic_network=critic,
            clip_epsilon=args.clip,
            entropy_coeff=args.ent_coef,
            # Advantages are per agent: normalising them over the batch would mix the agents' scales.
            normalize_advantage=False,
        )
        # Rewards, values and done flags per agent: GAE runs once per agent along time.
        self.loss.set_keys(
            reward=(group, "reward"),
            action=(group, "action"),
            value=(group, "state_value"),
            done=(group, "done"),
            terminated=(group, "terminated"),
        )
        self.loss.make_value_estimator(ValueEstimators.GAE, gamma=args.gamma, lmbda=args.gae_lambda)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=args.lr)

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        """Trains on ``batch`` (blocking: run it in a thread)."""
        args, group = self.args, self.group
        reward_shape = batch.get(("next", group, "reward")).shape
        for flag in ("done", "terminated"):
            # VMAS ends an episode for all agents at once, with root flags only; the value estimator reads
            # one per agent, beside the agent's reward.
            batch.set(("next", group, flag), batch.get(("next", flag)).unsqueeze(-1).expand(reward_shape))
        with torch.no_grad():
            self.loss.value_estimator(
                batch,
                params=self.loss.critic_network_params,
                target_params=self.loss.target_critic_network_params,
            )
        # [n_envs, T] into one axis of transitions: the advantages already carry the time structure.
        data = batch.reshape(-1)
        n = data.shape[0]
        for _ in range(args.epochs):
            order = torch.randperm(n)
            for start in range(0, n - args.minibatch_size + 1, args.minibatch_size):
                losses = self.loss(data[order[start : start + args.minibatch_size]])
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                self.optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.loss.parameters(), args.max_grad_norm)
                self.optim.step()
        return {key: losses[key].item() for key in ("loss_objective", "loss_critic", "entropy")}


async def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # as in ppo_cartpole.py: on 2 cores, more threads fight for them
    env = make_env(args)
    policy, critic, group = make_agents(env, args)
    mappo = MAPPO(policy, critic, group, args)
    # In-process: VMAS steps all scenarios in one batched torch call, so worker processes would add
    # copies of batches and nothing else on 2 cores. The collector takes the env built above.
    collector = Collector(env, policy, frames_per_batch=args.frames_per_batch, total_frames=args.total_frames)
    start, first, now = time.monotonic(), "", ""
    async with collector:
        collector.set_seed(args.seed)
        async for batch in collector:
            # Reward per agent per step of this batch: what the policy that collected it earns.
            reward = batch.get(("next", group, "reward")).mean().item()
            # Training in a thread keeps the event loop free.
            info = await asyncio.to_thread(mappo.update, batch)
            version = await collector.update_policy_weights_(policy)  # the next batch is the new policy's
            stats = collector.stats()
            # An episode ends early once every agent is on its goal: a shorter one is a better policy too.
            now = f"return {stats.episode_return_mean or 0:.2f} over {stats.episode_length_mean or 0:.0f} steps"
            first = first or now
            print(
                f"frames {collector.frames:7d}  episodes {stats.episodes:5d}  last 100: {now}  "
                f"reward/step {reward:6.3f}  entropy {info['entropy']:6.3f}  v_loss {info['loss_critic']:6.3f}  "
                f"policy v{version}  {collector.frames / (time.monotonic() - start):5.0f} frames/s",
                flush=True,
            )
    stats = collector.stats()
    groups = ", ".join(f"{name} {value:.2f}" for name, value in stats.group_return_mean.items())
    print(
        f"done: {stats.frames} frames in {time.monotonic() - start:.0f}s; mean of the last 100 episodes: {first} "
        f"after the first batch, {now} at the end (returns summed over the agents; per group: {groups})"
    )


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
