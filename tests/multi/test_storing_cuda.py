"""Batches to a GPU by DMA: the workers' shared memory registered with CUDA, copied on a side stream. Skipped without a
GPU (``-m gpu`` on a GPU machine runs them)."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from acollect import MultiAsyncCollector, MultiSyncCollector
from acollect._batches.cuda_dma import DeviceCopier
from acollect._batches.shm import ShmTensorDictSlot
from acollect._runtime.wire import encode_tensordict
from acollect.testing import CountingEnv, PixelEnv, assert_counting_batch

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


async def _pixel_streams(device: str, start_method: str, per_worker: int = 4) -> dict[int, list[TensorDictBase]]:
    """Each worker's first ``per_worker`` batches, from a first-ready collector of pixel envs storing on ``device``."""
    envs = [functools.partial(PixelEnv, num_envs=8)] * 2
    streams: dict[int, list[TensorDictBase]] = {0: [], 1: []}
    async with MultiAsyncCollector(envs, None, frames_per_batch=128, storing_device=device,
                                   start_method=start_method) as collector:  # fmt: skip
        while min(len(stream) for stream in streams.values()) < per_worker:
            batch = await anext(collector)
            stream = streams[int(batch["collector", "worker_id"][0, 0])]
            if len(stream) < per_worker:
                stream.append(batch)
    return streams


async def test_pixel_batches_land_on_the_gpu_as_uint8_with_the_values_a_cpu_run_stores(start_method: str) -> None:
    # A worker's stream of batches is the same on every run (each frame one value: its env's step count modulo 251),
    # whichever worker is ready first: each GPU batch is checked against the same worker's batch of a CPU run.
    streams = await _pixel_streams("cuda", start_method)
    reference = await _pixel_streams("cpu", start_method)
    for worker, stream in streams.items():
        for i, (batch, expected) in enumerate(zip(stream, reference[worker], strict=True)):
            assert batch["pixels"].device.type == "cuda"
            assert batch["pixels"].dtype == torch.uint8
            for key in ("pixels", ("next", "pixels"), ("next", "reward"), ("next", "done")):
                assert torch.equal(batch[key].cpu(), expected[key]), f"worker {worker}, batch {i}: {key} differs"
            host = batch.cpu()
            assert torch.equal(host["next", "pixels"].long(), (host["pixels"].long() + 1) % 251)
