"""Every worker's stream of steps is contiguous across batches: pauses hold a batch, they never drop it.

Counting envs (each observation is its env's step counter, see :mod:`acollect.testing`) with endless
episodes make a gap visible as a jump between the last ``("next", "observation")`` of one batch and the
first ``"observation"`` of the worker's next batch.
"""

from __future__ import annotations

import anyio
import pytest
import torch
from tensordict import TensorDictBase

from acollect import MultiAsyncCollector, MultiSyncCollector
from acollect.testing import CountingEnv, WeightProbe


def endless(num_envs: int = 4):
    return lambda: CountingEnv(num_envs=num_envs, episode_length=10**6)


class Stream:
    """The last observation each worker delivered, and every jump found since."""

    def __init__(self) -> None:
        self.tail: dict[int, torch.Tensor] = {}
        self.gaps: list[str] = []

    def feed(self, worker: int, part: TensorDictBase) -> None:
        obs = part["observation"][..., 0]
        assert (obs[:, 1:] - obs[:, :-1]).eq(1).all(), "a gap inside a batch"
        if worker in self.tail and not torch.equal(obs[:, 0], self.tail[worker]):
            self.gaps.append(f"worker {worker}: {self.tail[worker].tolist()} -> {obs[:, 0].tolist()}")
        self.tail[worker] = part["next", "observation"][:, -1, 0]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_pauses_between_batches_keep_every_stream_contiguous(start_method: str, kind: str) -> None:
    stream = Stream()
    if kind == "sync":
        collector: MultiSyncCollector | MultiAsyncCollector = MultiSyncCollector(
            [endless()] * 2, WeightProbe(0.0), frames_per_batch=256, start_method=start_method
        )
    else:
        collector = MultiAsyncCollector([endless()] * 2, WeightProbe(0.0), frames_per_batch=128,
                                        start_method=start_method)  # fmt: skip
    async with collector:
        for i in range(12):
            batch = await anext(collector)
            if kind == "sync":
                for w in range(2):
                    stream.feed(w, batch[w])
            else:
                stream.feed(int(batch["collector", "worker_id"][0, 0]), batch)
            if i % 2 == 0:
                # Workers are collecting ahead now: the pause stops them mid-batch.
                async with collector.pause():
                    await anyio.sleep(0.02)
        stats = collector.stats()
    assert stream.gaps == []
    assert stats.discarded_frames == 0
    assert stats.dropped_batches == 0


async def test_weights_pushed_during_a_pause_apply_from_the_next_batch_begun(start_method: str) -> None:
    # A batch a pause holds half-way is finished with the weights that began it: one version per batch.
    stream = Stream()
    async with MultiAsyncCollector(
        [endless()] * 2, WeightProbe(0.0), frames_per_batch=128, start_method=start_method
    ) as collector:
        batches = [await anext(collector)]
        async with collector.pause():
            await collector.update_policy_weights_(WeightProbe(1.0))
        with anyio.fail_after(60):
            while len(batches) < 8:
                batches.append(await anext(collector))
    for batch in batches:
        stream.feed(int(batch["collector", "worker_id"][0, 0]), batch)
        versions = batch["collector", "policy_version"]
        assert versions.eq(versions[0, 0]).all(), "a batch mixes two versions"
        assert batch["action"].eq(versions).all(), "a frame's version is not the one that chose it"
    assert stream.gaps == []
    assert batches[-1]["collector", "policy_version"].eq(1).all()
