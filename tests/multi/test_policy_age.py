"""``max_policy_lag``: a batch too many versions behind the collector's weights is dropped at hand-out."""

from __future__ import annotations

import contextlib
import functools

import anyio
import pytest
import torch

from acollect import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.testing import CountingEnv, SlowEnv, WeightProbe, assert_counting_batch

env = functools.partial(CountingEnv, num_envs=2, episode_length=1000)


@pytest.mark.parametrize("kind", ["MultiAsync", "Batched"])
async def test_batches_older_than_the_limit_are_dropped_and_the_stream_goes_on(kind: str, start_method: str) -> None:
    probe = WeightProbe(0.0)
    cls = MultiAsyncCollector if kind == "MultiAsync" else AsyncBatchedCollector
    kwargs = {"frames_per_batch": 16, "credits": 2, "max_policy_lag": 1, "start_method": start_method}
    handed_out = []
    with anyio.fail_after(90):
        async with cls([env] * 2, probe, **kwargs) as collector:
            for step in range(12):
                batch = await anext(collector)
                lag = collector.policy_version - int(batch["collector", "policy_version"].min())
                assert lag <= 1, f"a batch {lag} versions behind was handed out"
                handed_out.append(batch.clone())
                if step in (2, 3, 6, 7):  # two pushes in a row: the batches collected ahead are two behind
                    with torch.no_grad():
                        probe.w.add_(0.25)
                    await collector.update_policy_weights_(probe)
            stats = collector.stats()
    if kind == "MultiAsync":  # its workers collected ahead under the old weights: those batches were two behind
        assert stats.stale_batches >= 1
    assert stats.frames == 12 * 16
    for batch in handed_out:
        assert_counting_batch(batch)


async def test_a_limit_that_drops_every_batch_is_said_not_waited_on(start_method: str) -> None:
    probe = WeightProbe(0.0)
    # A batch takes 40 ms, a push a few: every batch is behind by the time it is handed out.
    slow = functools.partial(SlowEnv, 0.01, num_envs=2)
    collector = MultiAsyncCollector([slow] * 2, probe, frames_per_batch=8, max_policy_lag=0, start_method=start_method)

    async def push_forever() -> None:
        # The error breaks the collector: a push that comes after it raises the same error, which is expected here.
        with contextlib.suppress(CollectorStateError):
            while True:
                await collector.update_policy_weights_(probe)

    with anyio.fail_after(120):
        async with collector:
            await anext(collector)
            async with anyio.create_task_group() as tg:
                tg.start_soon(push_forever)
                with pytest.raises(CollectorStateError, match=r"max_policy_lag=0: the last \d+ batches"):  # noqa: PT012
                    for _ in range(200):
                        await anext(collector)
                tg.cancel_scope.cancel()


def test_the_limit_is_refused_where_nothing_can_be_stale_and_checked_where_it_applies() -> None:
    with pytest.raises(ConfigurationError, match=r"max_policy_lag.*lockstep"):
        MultiSyncCollector([env] * 2, frames_per_batch=8, max_policy_lag=1)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="max_policy_lag"):
        MultiAsyncCollector([env] * 2, frames_per_batch=8, max_policy_lag=-1)
