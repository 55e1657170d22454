"""Atari through ale-py's vector env: ``AtariVectorEnv`` wrapped by ``GymEnv``, collected in-process.

Skipped where ale-py is not installed (``pip install 'acollect[atari]'``; the ROMs come with it).
A real Atari step pushes one new frame onto the observation's stack of 4, so frames 1-3 of a step's
observation are frames 0-2 of the next one; ale-py's no-op autoreset step (final observation -> a
fresh stack) fails that check, so a batch that held one would fail here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from acollect import Collector
from acollect.envs import GymEnv
from acollect.testing import no_leaks

ale_py = pytest.importorskip("ale_py")
from ale_py.vector_env import AtariVectorEnv  # noqa: E402

pytestmark = pytest.mark.atari

N_ENVS, STEPS = 8, 16


def pong(num_envs: int = N_ENVS, **kwargs: Any) -> AtariVectorEnv:
    return AtariVectorEnv(game="pong", num_envs=num_envs, num_threads=1, **kwargs)


def assert_real_atari_transitions(batch: TensorDictBase) -> None:
    """Every step of a ``[E, T]`` batch pushed one frame, and the next step starts where it ended (or afresh)."""
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert torch.equal(nxt[:, :, :3], obs[:, :, 1:]), "a step that did not push one frame onto the stack"
    done = batch["next", "done"].squeeze(-1)
    same = (obs[:, 1:] == nxt[:, :-1]).flatten(2).all(-1)
    assert torch.equal(same | done[:, :-1], torch.ones_like(same)), "a step that does not start where the last ended"
    assert not batch["done"].any()


async def test_collector_gives_pong_batches_of_uint8_frame_stacks() -> None:
    with no_leaks():
        async with Collector(
            lambda: GymEnv(pong()), None, frames_per_batch=N_ENVS * STEPS, total_frames=N_ENVS * STEPS * 2
        ) as collector:
            batches = [batch async for batch in collector]
    assert len(batches) == 2
    for batch in batches:
        assert batch.batch_size == (N_ENVS, STEPS)
        for key in ("observation", ("next", "observation")):
            assert batch[key].shape == (N_ENVS, STEPS, 4, 84, 84)
            assert batch[key].dtype == torch.uint8
        assert batch["action"].dtype == torch.int64
        assert set(batch["action"].unique().tolist()) <= set(range(6))  # Pong's minimal action set
        assert batch["next", "reward"].shape == (N_ENVS, STEPS, 1)
        assert batch["next", "reward"].dtype == torch.float32
    assert_real_atari_transitions(torch.cat(batches, dim=1))


async def test_episode_ends_hold_no_step_that_did_not_happen() -> None:
    # 40 frames per episode at 4 frames per step: every episode is 10 steps, cut by truncation; without
    # no-op starts every episode starts from the same frames.
    make = lambda: pong(4, max_num_frames_per_episode=40, noop_max=0)  # noqa: E731
    async with Collector(make, None, frames_per_batch=4 * 16, total_frames=4 * 16 * 2) as collector:
        batch = torch.cat([b async for b in collector], dim=1)
    assert_real_atari_transitions(batch)
    done, truncated = batch["next", "done"].squeeze(-1), batch["next", "truncated"].squeeze(-1)
    expected = torch.tensor([(t + 1) % 10 == 0 for t in range(32)]).expand(4, 32)
    assert torch.equal(done, expected), "an episode of other than 10 steps: a no-op step was handed out"
    assert torch.equal(truncated, done)
    obs = batch["observation"]
    for t in (10, 20, 30):
        assert torch.equal(obs[:, t], obs[:, 0]), f"step {t} does not start a fresh episode"
