"""Background mode's replay ratio: the collector never runs far ahead of the trainer, nor the trainer ahead of it."""

from __future__ import annotations

import functools

import anyio
import pytest

from acollect import Collector, MultiAsyncCollector, ReplayBuffer
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.testing import CountingEnv, wait_until

FPB = 16
env = functools.partial(CountingEnv, num_envs=4)


def make(kind: str, **kwargs: object) -> Collector | MultiAsyncCollector:
    if kind == "Collector":
        return Collector(env, frames_per_batch=FPB, **kwargs)  # type: ignore[arg-type]
    return MultiAsyncCollector([env] * 2, frames_per_batch=FPB, start_method="forkserver", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["Collector", "MultiAsync"])
@pytest.mark.parametrize("frames_per_update", [4, 0.5])
async def test_the_ratio_holds_from_both_sides(kind: str, frames_per_update: float) -> None:
    learning_starts, ahead = 32, 48
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(60):
        async with make(kind, total_frames=-1) as collector:
            collector.start(rb, frames_per_update=frames_per_update, learning_starts=learning_starts,
                            max_frames_ahead=ahead)  # fmt: skip
            await collector.trained(updates=0)
            assert collector.frames >= learning_starts + frames_per_update
            for step in range(60):
                if step % 7 == 0:
                    await anyio.sleep(0.02)  # a slow update now and then: the collector must wait for it
                await collector.trained()
                updates = collector.updates
                assert updates == step + 1
                assert collector.frames >= learning_starts + (updates + 1) * frames_per_update, "trainer ahead"
                # One batch may be on its way when the trainer catches up: the bound plus one batch.
                bound = learning_starts + updates * frames_per_update + ahead + FPB
                assert collector.frames <= bound, f"collector ahead: {collector.frames} > {bound}"
            assert len(rb) == collector.frames


async def test_without_a_trainer_the_collector_stops_at_its_lead() -> None:
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(60):
        async with make("Collector", total_frames=-1) as collector:
            collector.start(rb, frames_per_update=2, learning_starts=16, max_frames_ahead=32)
            await wait_until(lambda: collector.frames >= 48, timeout=30)
            await anyio.sleep(0.3)
            assert collector.frames <= 16 + 32 + FPB, "a replay ratio with no updates: no runaway collection"
            stalled = collector.frames
            await collector.trained(updates=40)  # 40 updates: room for 80 more frames
            await wait_until(lambda: collector.frames >= stalled + 64, timeout=30)


async def test_trained_returns_once_the_collector_has_collected_its_frames() -> None:
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(60):
        async with make("Collector", total_frames=64) as collector:
            collector.start(rb, frames_per_update=1)
            await collector.trained(updates=10_000)  # would wait for 10,001 frames: only 64 come
            assert collector.exhausted


async def test_trained_until_takes_the_running_total() -> None:
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(60):
        async with make("Collector", total_frames=-1) as collector:
            collector.start(rb, frames_per_update=2, learning_starts=16, max_frames_ahead=32)
            for total in range(0, 30, 3):
                await collector.trained_until(total)
                # A total, not a sum of totals (which would be 0 + 3 + ... + 27 = 135 updates by the end).
                assert collector.updates == total
                assert collector.frames >= 16 + (total + 1) * 2, "trainer ahead"
                assert collector.frames <= 16 + total * 2 + 32 + FPB, "collector ahead"
            with pytest.raises(ConfigurationError, match=r"total=3 is invalid: expected at least the 27 updates"):
                await collector.trained_until(3)
            assert collector.updates == 27  # nothing counted by the refused call
            await collector.trained(updates=3)  # the two spellings mix: 3 more
            assert collector.updates == 30
            await collector.trained_until(30)  # the same total again: nothing more
            assert collector.updates == 30


async def test_a_count_given_by_position_is_refused_naming_both_spellings() -> None:
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(60):
        async with make("Collector", total_frames=-1) as collector:
            collector.start(rb, frames_per_update=2)
            with pytest.raises(TypeError) as refused:
                await collector.trained(8)
            message = str(refused.value)
            assert "trained(updates=8)" in message, message
            assert "8 more updates" in message, message
            assert "trained_until(8)" in message, message
            assert collector.updates == 0  # nothing counted
            with pytest.raises(ConfigurationError, match="updates=-1"):
                await collector.trained(updates=-1)


async def test_bad_ratios_are_refused_naming_the_argument() -> None:
    rb = ReplayBuffer(100)
    async with make("Collector", total_frames=-1) as collector:
        with pytest.raises(ConfigurationError, match="frames_per_update"):
            collector.start(rb, frames_per_update=0)
        with pytest.raises(ConfigurationError, match="max_frames_ahead"):
            collector.start(rb, frames_per_update=64, max_frames_ahead=8)
        with pytest.raises(ConfigurationError, match="frames_per_update"):
            collector.start(rb, learning_starts=100)
        with pytest.raises(ConfigurationError, match="learning_starts"):
            collector.start(rb, frames_per_update=1, learning_starts=-1)
        with pytest.raises(CollectorStateError, match="frames_per_update"):
            await collector.trained()
        with pytest.raises(CollectorStateError, match="frames_per_update"):
            await collector.trained_until(0)
