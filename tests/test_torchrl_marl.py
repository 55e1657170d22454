"""TorchRL's multi-agent envs (VMAS, PettingZoo through its wrapper) through acollect, compared with TorchRL's own
``Collector`` on the same env, and the batches fed to TorchRL's GAE and ``ClipPPOLoss`` with the group keys.

Runs where torchrl (and vmas, pettingzoo with mpe2) are installed: CI installs them for its interop step.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
)

torchrl = pytest.importorskip("torchrl")
pytestmark = [
    pytest.mark.torchrl,
    # TorchRL warns that it was tested with another PettingZoo release: not about acollect.
    pytest.mark.filterwarnings("ignore:PettingZoo in TorchRL is tested"),
    pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater"),  # inside TorchRL's own collector
]

START = {"start_method": "forkserver"}


def vmas_navigation(num_envs: int = 4, n_agents: int = 3) -> Any:
    from torchrl.envs.libs.vmas import VmasEnv

    return VmasEnv("navigation", num_envs=num_envs, n_agents=n_agents, max_steps=20, seed=0)


def simple_spread(continuous: bool = False) -> Any:
    from mpe2 import simple_spread_v3
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    return PettingZooWrapper(simple_spread_v3.parallel_env(N=2, max_cycles=10, continuous_actions=continuous))


def _needs(env: str) -> None:
    pytest.importorskip("vmas" if env == "vmas" else "mpe2")


ENVS = {"vmas": vmas_navigation, "simple_spread": simple_spread}


def _leaves(batch: TensorDictBase, batch_dims: int) -> dict[tuple[str, ...], tuple[tuple[int, ...], torch.dtype]]:
    """Each leaf's trailing shape (past the batch dims) and dtype, the collector's own keys aside."""
    return {
        (key,) if isinstance(key, str) else key: (tuple(leaf.shape[batch_dims:]), leaf.dtype)
        for key, leaf in batch.items(include_nested=True, leaves_only=True)
        if (key if isinstance(key, str) else key[0]) != "collector"
    }


def _torchrl_batch(make_env: Any) -> TensorDictBase:
    from torchrl.collectors import Collector as TorchRLCollector

    env = make_env()
    collector = TorchRLCollector(env, None, frames_per_batch=40, total_frames=40)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


@pytest.mark.parametrize("name", sorted(ENVS))
async def test_the_batch_has_the_leaves_torchrls_collector_gives(name: str) -> None:
    _needs(name)
    ours: TensorDictBase | None = None
    async with Collector(ENVS[name], None, frames_per_batch=40, total_frames=40) as collector:
        async for batch in collector:
            ours = batch
    assert ours is not None
    batch = _torchrl_batch(ENVS[name])
    theirs = _leaves(batch, batch.batch_dims)
    mine = _leaves(ours, 2)
    assert {key: mine[key] for key in theirs} == theirs
    # acollect's one addition: a root "truncated" flag (always False here) where an env has none, which its
    # own truncations (max_frames_per_traj, an env rebuilt after a fault) write.
    assert set(mine) - set(theirs) <= {("truncated",), ("next", "truncated")}


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector, AsyncCollector, AsyncBatchedCollector])
async def test_torchrls_multi_agent_envs_go_through_every_collector(name: str, kind: type) -> None:
    _needs(name)
    env = ENVS[name]()
    group = env.action_keys[0][0]
    expected = _leaves(env.fake_tensordict(), env.batch_dims)
    env.close()
    policy = _zero_policy(name) if kind is AsyncBatchedCollector else None
    make = ENVS[name] if kind is AsyncCollector else [ENVS[name]] * 2
    async with kind(make, policy, frames_per_batch=16, total_frames=32, **START) as collector:
        n = 0
        async for batch in collector:
            n += 1
            leaves = _leaves(batch, batch.batch_dims)
            for key in (("next", group, "reward"), (group, "action"), (group, "observation")):
                assert leaves[key] == expected[key], key
            assert not batch["next", group, "observation"].isnan().any()
    assert n == 2


def _zero_policy(name: str) -> Any:
    from tensordict.nn import TensorDictModule

    env = ENVS[name]()
    key = env.action_keys[0]
    spec = env.full_action_spec[key]
    env.close()
    shape = tuple(spec.shape[len(env.batch_size) :])

    def act(observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*observation.shape[:-2], *shape, dtype=spec.dtype)

    return TensorDictModule(act, in_keys=[(key[0], "observation")], out_keys=[key])


async def test_a_batch_feeds_torchrls_gae_and_clip_ppo_loss_with_the_group_keys() -> None:
    pytest.importorskip("vmas")
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal
    from torchrl.objectives import ClipPPOLoss, ValueEstimators

    env = vmas_navigation()
    n_agents, obs_dim = env.full_observation_spec["agents", "observation"].shape[-2:]
    act_dim = env.full_action_spec["agents", "action"].shape[-1]
    spec = env.full_action_spec["agents", "action"]
    env.close()
    net = nn.Sequential(
        MultiAgentMLP(obs_dim, 2 * act_dim, n_agents, centralised=False, share_params=True, depth=1, num_cells=16),
        NormalParamExtractor(),
    )
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=[("agents", "observation")], out_keys=[("agents", "loc"), ("agents", "scale")]),
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[("agents", "action")],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
        return_log_prob=True,
    )
    critic = TensorDictModule(
        MultiAgentMLP(obs_dim, 1, n_agents, centralised=True, share_params=True, depth=1, num_cells=16),
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "state_value")],
    )
    loss = ClipPPOLoss(actor, critic)
    loss.set_keys(
        reward=("agents", "reward"),
        action=("agents", "action"),
        value=("agents", "state_value"),
        done=("agents", "done"),
        terminated=("agents", "terminated"),
        advantage=("agents", "advantage"),
        value_target=("agents", "value_target"),
    )
    loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.9)
    log_prob_key = loss.tensor_keys.sample_log_prob
    async with Collector(vmas_navigation, actor, frames_per_batch=40, total_frames=40) as collector:
        batch = await anext(collector)
    assert log_prob_key in batch.keys(True, True)
    # VMAS's flags are the root's alone: as TorchRL's MAPPO tutorial does, each agent gets them.
    for flag in ("done", "terminated"):
        root = batch.get(("next", flag))
        batch.set(("next", "agents", flag), root.unsqueeze(-1).expand(*root.shape[:-1], n_agents, 1))
    with torch.no_grad():
        loss.value_estimator(batch, params=loss.critic_network_params, target_params=loss.target_critic_network_params)
    assert batch["agents", "advantage"].shape == (*batch.shape, n_agents, 1)
    losses = loss(batch.reshape(-1))
    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
    assert torch.isfinite(total)
    total.backward()
    assert all(p.grad is not None for p in actor.parameters() if p.requires_grad)


@pytest.mark.parametrize("continuous", [False, True])
async def test_pettingzoo_through_torchrls_wrapper_keeps_each_agents_flags(continuous: bool) -> None:
    pytest.importorskip("mpe2")
    env = functools.partial(simple_spread, continuous)
    async with MultiSyncCollector([env, env], None, frames_per_batch=40, total_frames=40, **START) as collector:
        batch = await anext(collector)
    root, agents = batch["next", "done"], batch["next", "agent", "done"]
    assert agents.shape[-2:] == (2, 1)
    assert torch.equal(root.squeeze(-1), agents.squeeze(-1).all(-1))  # every agent done when the episode is
    assert int(root.sum()) == 4  # episodes of 10 steps: 20 steps in each of the 2 workers' envs
