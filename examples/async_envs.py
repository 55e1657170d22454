"""Coroutine envs: train a policy on CartPole served over HTTP, each env an aiohttp client stepped on the event loop.

The example starts a small aiohttp web service that holds CartPole-v1 envs (``POST /envs/{id}/reset``,
``POST /envs/{id}/step``), then a ``Collector`` over an ``AsyncEnvPool`` of clients: each env is an
``acollect.envs.AsyncEnv`` whose ``step`` is an HTTP request, every env a task on this process's
event loop, the policy run on the envs waiting for an action. A few iterations of a vanilla policy
gradient improve the policy; the mean episode return is printed as it goes. Needs aiohttp
(``pip install aiohttp``). Run it with ``python examples/async_envs.py`` (``--help`` lists the options).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aiohttp
import gymnasium as gym
import numpy as np
import torch
import tyro
from aiohttp import web

from acollect import Collector
from acollect.envs import AsyncEnv, AsyncEnvPool


@dataclasses.dataclass
class Args:
    num_envs: int = 32
    """envs, each an HTTP client of the service, stepped concurrently"""
    frames_per_batch: int = 2048
    """frames in each batch (one policy update per batch)"""
    iterations: int = 10
    """batches collected and trained on"""
    lr: float = 0.01
    """Adam's learning rate"""
    gamma: float = 0.99
    """discount of the returns"""
    seed: int = 0
    """seed of the envs and the policy"""


# -- the service: CartPole-v1 envs behind HTTP --------------------------------------------------------
def make_service() -> web.Application:
    envs: dict[str, gym.Env[Any, Any]] = {}

    async def reset(request: web.Request) -> web.Response:
        key, body = request.match_info["id"], await request.json()
        env = envs.setdefault(key, gym.make("CartPole-v1"))
        obs, _ = env.reset(seed=body.get("seed"))
        return web.json_response({"observation": obs.tolist()})

    async def step(request: web.Request) -> web.Response:
        env, body = envs[request.match_info["id"]], await request.json()
        obs, reward, terminated, truncated, _ = env.step(int(body["action"]))
        return web.json_response({"observation": obs.tolist(), "reward": float(reward),
                                  "terminated": bool(terminated), "truncated": bool(truncated)})  # fmt: skip

    app = web.Application()
    app.router.add_post("/envs/{id}/reset", reset)
    app.router.add_post("/envs/{id}/step", step)
    return app


# -- the env: a client of the service --------------------------------------------------------------------
class RemoteCartPole(AsyncEnv):
    """CartPole-v1 stepped over HTTP: each ``step`` is a ``POST`` awaited on the event loop."""

    observation_space = gym.make("CartPole-v1").observation_space
    action_space = gym.spaces.Discrete(2)
    url = ""  # the service's address, set once it listens
    count = 0

    def __init__(self) -> None:
        RemoteCartPole.count += 1
        self.id = RemoteCartPole.count
        self.session: aiohttp.ClientSession | None = None

    async def _post(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.session is None:  # opened here, on the loop that steps the env
            self.session = aiohttp.ClientSession()
        async with self.session.post(f"{self.url}/envs/{self.id}/{what}", json=body) as response:
            response.raise_for_status()
            result: dict[str, Any] = await response.json()
            return result

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        answer = await self._post("reset", {"seed": seed})
        return np.asarray(answer["observation"], np.float32), {}

    async def step(self, action: int) -> Any:
        answer = await self._post("step", {"action": action})
        obs = np.asarray(answer["observation"], np.float32)
        return obs, answer["reward"], answer["terminated"], answer["truncated"], {}

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


# -- the policy and its update -----------------------------------------------------------------------------
class Policy(torch.nn.Module):
    """A 4-64-2 MLP; ``forward`` samples an action, ``log_prob`` scores the actions taken."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Categorical(logits=self.net(observation)).sample()

    def log_prob(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Categorical(logits=self.net(observation)).log_prob(action)


def returns_to_go(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns within each row ``[E, T]``, cut at episode ends (and at the batch's end)."""
    out, running = torch.zeros_like(reward), torch.zeros_like(reward[:, 0])
    for t in reversed(range(reward.shape[1])):
        running = reward[:, t] + gamma * running * (~done[:, t]).float()
        out[:, t] = running
    return out


async def main(args: Args) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    runner = web.AppRunner(make_service())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    RemoteCartPole.url = f"http://{host}:{port}"
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    returns: list[float] = []
    try:
        async with Collector(lambda: AsyncEnvPool(RemoteCartPole, args.num_envs, step_timeout=10.0), policy,
                             frames_per_batch=args.frames_per_batch,
                             total_frames=args.iterations * args.frames_per_batch) as collector:  # fmt: skip
            collector.set_seed(args.seed)
            async for batch in collector:
                reward, done = batch["next", "reward"][..., 0], batch["next", "done"][..., 0]
                advantage = returns_to_go(reward, done, args.gamma)
                advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
                loss = -(policy.log_prob(batch["observation"], batch["action"]) * advantage).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                await collector.update_policy_weights_(policy)
                stats = collector.stats()
                returns.append(stats.episode_return_mean or 0.0)
                print(f"frames {collector.frames:>7d}  |  {stats.frames_per_s:>6.0f} frames/s  |  "
                      f"mean episode return {returns[-1]:6.1f}  |  loss {loss.item():+.3f}", flush=True)  # fmt: skip
    finally:
        await runner.cleanup()
    print(f"done: {collector.frames} frames over HTTP, mean episode return {returns[0]:.1f} -> {returns[-1]:.1f}")


if __name__ == "__main__":
    asyncio.run(main(tyro.cli(Args, description=__doc__.splitlines()[0])))
