"""Batches to a GPU by DMA: the workers' shared memory registered with CUDA, copied on a side stream. Skipped without a
GPU (``-m gpu`` on a GPU machine runs them)."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

from acollect import MultiAsyncCollector, MultiSyncCollector
from acollect.testing import CountingEnv, PixelEnv, assert_counting_batch
from acollect.transport._cuda_dma import DeviceCopier
from acollect.transport._shm import ShmTensorDictSlot
from acollect.transport._wire import encode_tensordict

pytestmark = pytest.mark.gpu


def test_a_shared_memory_batch_reaches_the_gpu_by_dma_ordered_before_the_callers_kernels() -> None:
    td = TensorDict({"obs": torch.arange(4096, dtype=torch.float32).view(64, 64)}, batch_size=[64])
    with ShmTensorDictSlot.create(encode_tensordict(td)[0]) as slot:
        slot.write(td)
        copier = DeviceCopier(torch.device("cuda"))
        try:
            copy = copier.copy(slot.tensordict)
            on_gpu = copier.hand_over(copy)
            total = on_gpu["obs"].sum()  # queued on the current stream, after the copy
            assert on_gpu["obs"].device.type == "cuda"
            assert total.item() == td["obs"].sum().item()
            copier.copied(copy)
            assert copy.done
            assert copier.registered_bytes > 0, "the segment is page-locked: the copy engine reads it directly"
        finally:
            copier.close()
        assert copier.registered_bytes == 0, "unregistered before the segment is unmapped"


@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector])
async def test_batches_land_on_the_gpu_whole_and_kept_ones_stay_intact(kind: type, start_method: str) -> None:
    envs = [functools.partial(CountingEnv, num_envs=4, episode_length=7)] * 2
    kept: list[tuple[TensorDict, TensorDict]] = []
    async with kind(envs, None, frames_per_batch=64, storing_device="cuda", start_method=start_method) as collector:
        async for batch in collector:
            assert batch["observation"].device.type == "cuda"
            assert_counting_batch(batch.cpu())
            if len(kept) < 10:
                kept.append((batch, batch.clone()))
            if collector.frames >= 64 * 30:
                break
    for batch, copy in kept:  # their shared memory was written many times since: the GPU copies are theirs
        assert (batch == copy).all()


async def test_pixels_go_to_the_gpu_without_a_cpu_copy_on_the_way(start_method: str) -> None:
    envs = [functools.partial(PixelEnv, num_envs=8)] * 2
    async with MultiAsyncCollector(envs, None, frames_per_batch=128, storing_device="cuda",
                                   start_method=start_method) as collector:  # fmt: skip
        for _ in range(8):
            batch = await anext(collector)
            assert batch["pixels"].device.type == "cuda"
            assert batch["pixels"].dtype == torch.uint8
