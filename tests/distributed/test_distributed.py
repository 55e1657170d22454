"""DistributedCollector (sync=False and sync=True) and DistributedSyncCollector over torch.distributed (gloo
here, NCCL on GPU machines), and RPCCollector's argument translation."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from acollect import (
    ConfigurationError,
    DistributedCollector,
    DistributedDataCollector,
    DistributedSyncCollector,
    DistributedSyncDataCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    RPCCollector,
    RPCDataCollector,
)
from acollect.testing import CountingEnv, GroupCountingEnv, assert_counting_batch, assert_group_counting_batch

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo"),
    pytest.mark.timeout(180),
]


class _Probe(torch.nn.Module):
    """Acts with ``clamp(w, 0, 1)``: the actions show which weights collected a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).clamp(0, 1).long()


async def test_sync_batches_and_weights_over_gloo() -> None:
    policy = _Probe()
    async with DistributedCollector(
        "CartPole-v1", policy, sync=True, backend="gloo", num_workers=2, frames_per_batch=64, total_frames=256,
        env_kwargs={"num_envs": 2}, dist_timeout=60,
    ) as collector:  # fmt: skip
        assert type(collector) is DistributedCollector  # one class with a mode: sync picks the strategy
        assert collector.sync is True
        seen = []
        async for batch in collector:
            assert batch.shape == (2, 2, 16)
            assert batch["observation"].dtype == torch.float32
            assert not batch["next", "observation"].isnan().any()
            ids = batch["collector", "traj_ids"]
            assert set(ids[0].flatten().tolist()).isdisjoint(ids[1].flatten().tolist())  # unique across workers
            seen.append((int(batch["collector", "policy_version"].max()), int(batch["action"].max())))
            if len(seen) == 2:
                with torch.no_grad():
                    policy.w.fill_(1.0)
                version = await collector.update_policy_weights_()  # through dist.broadcast
                assert version == 1
        assert seen[:2] == [(0, 0), (0, 0)]
        # The batch begun ahead before the push may come with version 0 (its frames say so); every batch
        # after it carries the broadcast weights, which act in every worker.
        assert seen[2] in [(0, 0), (1, 1)]
        assert seen[3:] == [(1, 1)] * (len(seen) - 3)
        assert len(seen) >= 4
    assert not dist.is_initialized()  # the process group went with the collector


async def test_async_batches_are_exact() -> None:
    async with DistributedCollector(
        [CountingEnv, CountingEnv], frames_per_batch=8, total_frames=48, backend="gloo"
    ) as collector:
        assert type(collector) is DistributedCollector
        assert collector.sync is False
        workers = set()
        async for batch in collector:
            assert batch.shape == (1, 8)  # one worker's whole batch, not a part from each
            assert_counting_batch(batch)  # every value made it through the tensors' own road intact
            workers.add(int(batch["collector", "worker_id"][0, 0]))
        assert workers == {0, 1}


def test_arguments() -> None:
    assert DistributedDataCollector is DistributedCollector
    assert DistributedSyncDataCollector is DistributedSyncCollector
    assert RPCDataCollector is RPCCollector
    with pytest.raises(ConfigurationError, match="backend"):
        DistributedCollector([CountingEnv], frames_per_batch=4, backend="tcp")
    with pytest.raises(ConfigurationError, match="max_worker_restarts"):
        DistributedSyncCollector([CountingEnv], frames_per_batch=4, max_worker_restarts=1)
    with pytest.raises(ConfigurationError, match="init_method"):
        DistributedSyncCollector([CountingEnv], frames_per_batch=4, tcp_port=1234, init_method="file:///tmp/x")
    with pytest.raises(ConfigurationError, match="dist_timeout"):
        DistributedSyncCollector([CountingEnv], frames_per_batch=4, dist_timeout=0)
    collector = DistributedSyncCollector([CountingEnv], frames_per_batch=4, tcp_port=29555)
    assert collector.init_method == "tcp://127.0.0.1:29555"


async def test_distributed_sync_collector_is_the_sync_mode_with_cat_results() -> None:
    async with DistributedSyncCollector(
        [CountingEnv, CountingEnv], frames_per_batch=8, total_frames=16, backend="gloo", cat_results=0
    ) as collector:
        assert isinstance(collector, DistributedCollector)
        assert collector.sync is True
        async for batch in collector:
            assert batch.shape == (2, 4)  # one part from each worker, concatenated along envs
            assert_counting_batch(batch)


def test_the_mode_takes_its_own_option_only() -> None:
    free = DistributedCollector([CountingEnv] * 2, frames_per_batch=8, credits=3)
    assert (free.sync, [c.rollout.frames_per_batch for c in free.worker_configs]) == (False, [8, 8])
    lockstep = DistributedCollector([CountingEnv] * 2, frames_per_batch=8, sync=True, cat_results=-1)
    assert (lockstep.sync, [c.rollout.frames_per_batch for c in lockstep.worker_configs]) == (True, [4, 4])
    with pytest.raises(ConfigurationError, match=r"cat_results.*sync=False"):
        DistributedCollector([CountingEnv], frames_per_batch=4, cat_results=0)
    with pytest.raises(ConfigurationError, match=r"credits.*sync=True"):
        DistributedCollector([CountingEnv], frames_per_batch=4, sync=True, credits=2)
    with pytest.raises(ConfigurationError, match=r"credits.*sync=True"):
        DistributedSyncCollector([CountingEnv], frames_per_batch=4, credits=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="sync"):
        DistributedSyncCollector([CountingEnv], frames_per_batch=4, sync=False)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="sync"):
        DistributedCollector([CountingEnv], frames_per_batch=4, sync=1)  # type: ignore[arg-type]


def test_rpc_collector_maps_torchrl_arguments() -> None:
    sync = RPCCollector([CountingEnv] * 2, frames_per_batch=8, sync=True, max_weight_update_interval=-1)
    assert isinstance(sync, MultiSyncCollector)
    assert sync.settings.max_weight_update_interval is None
    free = RPCCollector([CountingEnv] * 2, frames_per_batch=8, collector_class="SyncDataCollector", tcp_port=29556)
    assert isinstance(free, MultiAsyncCollector)
    assert free.settings.address == "tcp://127.0.0.1:29556"
    with pytest.raises(ConfigurationError, match="num_workers_per_collector"):
        RPCCollector([CountingEnv], frames_per_batch=8, num_workers_per_collector=2)
    with pytest.raises(ConfigurationError, match="collector_class"):
        RPCCollector([CountingEnv], frames_per_batch=8, collector_class=MultiSyncCollector)
    with pytest.raises(ConfigurationError, match="tensorpipe_options"):
        RPCCollector([CountingEnv], frames_per_batch=8, tensorpipe_options={"num_worker_threads": 4})


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank: 2 for a collector and a worker")
async def test_nccl_batches_gpu_to_gpu() -> None:
    policy = _Probe()
    async with DistributedSyncCollector(
        "CartPole-v1", policy, backend="nccl", num_workers=1, frames_per_batch=32, total_frames=96,
        env_kwargs={"num_envs": 2}, storing_device="cuda:1",
    ) as collector:  # fmt: skip
        n = 0
        async for batch in collector:
            assert batch.device.type == "cuda"
            n += 1
            if n == 1:
                with torch.no_grad():
                    policy.w.fill_(1.0)
                await collector.update_policy_weights_()
            else:
                assert int(batch["action"].min()) == 1


async def test_multi_agent_frames_come_through_torch_distributed_whole() -> None:
    env = functools.partial(GroupCountingEnv, num_envs=2, episode_length=[3, 4])
    for sync in (False, True):
        async with DistributedCollector(
            [env, env], frames_per_batch=16, total_frames=48, backend="gloo", sync=sync
        ) as collector:
            async for batch in collector:
                assert batch["next", "red", "reward"].shape[-2:] == (2, 1)
                assert_group_counting_batch(batch.reshape(-1, batch.shape[-1]))
