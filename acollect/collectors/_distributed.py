"""Collectors whose batches and weights move over torch.distributed: :class:`DistributedCollector`
(``sync=False``: first ready, first served; ``sync=True``: lockstep) and :class:`DistributedSyncCollector`
(the same class with ``sync=True`` fixed).

They are the multi-process collectors with one change of transport: control (commands,
heartbeats, batch headers, acknowledgements) stays on ZeroMQ, while the batch
tensors go worker -> collector with point-to-point sends and weight pushes go
collector -> workers with one broadcast, both through a torch.distributed process
group in which the collector is rank 0 and worker ``i`` is rank ``i + 1``
(:mod:`acollect._runtime.torch_dist`; the pool that moves them is
:class:`acollect._workers.distributed_pool.DistPool`). With ``backend="nccl"`` and CUDA batches,
a batch goes GPU to GPU without a host copy. Workers run wherever the launcher
puts them; every rank must reach ``init_method``.

A process group cannot take a new member once formed, so a worker that dies is
reported, never restarted (``max_worker_restarts`` must be 0), and one process
hosts one distributed collector at a time (torch.distributed's default group is
per process).

Examples:
    >>> import anyio
    >>> from acollect import DistributedCollector
    >>> from acollect.testing import CountingEnv
    >>> async def main():
    ...     async with DistributedCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=16, sync=True,
    ...                                     backend="gloo") as collector:
    ...         return collector.sync, [tuple(batch.shape) async for batch in collector]
    >>> anyio.run(main)
    (True, [(2, 1, 4), (2, 1, 4)])
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._policy import PolicyLike
from acollect._weights.sync import WeightSyncScheme
from acollect._weights.updates import WeightUpdate
from acollect._workers.distributed_pool import DistPool
from acollect._workers.launcher import Launcher
from acollect._workers.pool import WorkerPool
from acollect._workers.pool_settings import PoolSettings
from acollect.collectors._collector_settings import DistributedSettings
from acollect.collectors._keywords import keyword_errors, settings_from
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors._options import DEFAULT_START_METHOD, HEARTBEAT_TIMEOUT, Devices, Keys
from acollect.errors import ConfigurationError

__all__ = ["DistributedCollector", "DistributedSyncCollector"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: What DistributedCollector refuses, and why.
_DISTRIBUTED_REFUSES = {
    "worker_affinity": "its workers are torch.distributed ranks that may run on other hosts, whose cores this process "
    "cannot see; pin them where they start (taskset), or use MultiSyncCollector / MultiAsyncCollector",
    "on_worker_loss": "a torch.distributed process group cannot lose a rank: every collective waits for all of them, "
    "so a lost worker always breaks the collector",
}
#: What DistributedSyncCollector refuses besides, and why.
_DISTRIBUTED_SYNC_REFUSES = {
    **_DISTRIBUTED_REFUSES,
    "sync": "a DistributedSyncCollector is sync=True (DistributedCollector takes sync=...)",
    "credits": "a DistributedSyncCollector is sync=True (credits are for sync=False)",
}


class DistributedCollector(MultiCollectorBase):
    """Collects in worker processes whose batches and weights move over torch.distributed.

    One class, two modes: ``sync=False`` (default) takes batches as :class:`~acollect.MultiAsyncCollector`
    does (first ready, first served, each worker's batch tagged with its ``worker_id``); ``sync=True`` as
    :class:`~acollect.MultiSyncCollector` does (one part from every worker, all collected with the same
    weights, stacked or concatenated). The mode is the collector's dispatch strategy
    (:mod:`acollect.collectors._dispatch`); :class:`DistributedSyncCollector` is this class with
    ``sync=True`` fixed.

    Args:
        create_env_fn: one env factory per worker (a list), or one for ``num_workers`` workers.
        policy: the policy (see :class:`~acollect.MultiSyncCollector`).

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.DistributedSettings` declares it.

    Raises:
        ConfigurationError: a bad argument, the other mode's option, a backend torch does not have here, or
            ``max_worker_restarts``.
    """

    settings_class: ClassVar[type[DistributedSettings]] = DistributedSettings
    settings: DistributedSettings

    @keyword_errors(refused=_DISTRIBUTED_REFUSES)
    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_factory: Callable[[], PolicyLike] | str | None = None,
        device: Devices | None = None,
        env_device: Devices | None = None,
        policy_device: Devices | None = None,
        storing_device: Devices | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        env_errors: str = "raise",
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        trajs_per_batch: int | None = None,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        env_kwargs: Mapping[str, Any] | None = None,
        progress: bool | str = False,
        collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int | None = None,
        weight_sync_schemes: Mapping[str, WeightSyncScheme] | None = None,
        max_worker_restarts: int = 0,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 5.0,
        address: str | None = None,
        start_method: str = DEFAULT_START_METHOD,
        launcher: str | Launcher = "local",
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Keys | None = None,
        copy_batches: bool = False,
        max_lent_bytes: int | None = None,
        cuda_dma: bool = False,
        filter_worker_warnings: bool = True,
        num_workers: int | None = None,
        credits: int | None = None,
        max_policy_lag: int | None = None,
        cat_results: str | int | None = None,
        sync: bool = False,
        backend: str = "gloo",
        tcp_port: int | None = None,
        init_method: str | None = None,
        master_addr: str = "127.0.0.1",
        dist_timeout: float = 60.0,
    ) -> None:
        self._join(create_env_fn, policy, settings_from(DistributedSettings, locals()))

    def _join(self, create_env_fn: Any, policy: PolicyLike, settings: DistributedSettings) -> None:
        address, port = settings.master_addr, settings.tcp_port
        #: the torch.distributed init URL every rank joins (``init_method``, else the rendezvous on ``master_addr``)
        self.init_method = settings.init_method or f"tcp://{address}:{port or _free_port(address)}"
        super().__init__(create_env_fn, policy, settings)

    @property
    def backend(self) -> str:
        """The torch.distributed backend (``"gloo"``, ``"nccl"`` or ``"mpi"``)."""
        return self.settings.backend

    def _new_pool(self, settings: PoolSettings) -> WorkerPool:
        dist_options = {"backend": self.backend, "init_method": self.init_method, "timeout": self.settings.dist_timeout}
        return DistPool(self._configs, settings, on_failure=self._fail, dist_options=dist_options)

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        # A broadcast reaches every worker of the process group: worker_ids may only name them all.
        if update.worker_ids is not None and sorted(set(update.worker_ids)) != list(range(self.num_workers)):
            raise ConfigurationError.bad_value(
                "worker_ids", list(update.worker_ids), "None: a broadcast reaches every worker of the process group"
            )
        return await super()._update_policy_weights(dataclasses.replace(update, worker_ids=None))


class DistributedSyncCollector(DistributedCollector):
    """:class:`DistributedCollector` with ``sync=True`` fixed: every batch holds one part from each worker,
    collected with the same weights (TorchRL's ``DistributedSyncDataCollector``).

    Takes the arguments of :class:`DistributedCollector` but ``sync`` and ``credits``; ``cat_results`` says
    how worker batches combine (see :class:`~acollect.MultiSyncCollector`).

    Args:
        create_env_fn: one env factory per worker (a list), or one for ``num_workers`` workers.
        policy: the policy (see :class:`~acollect.MultiSyncCollector`).

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.DistributedSettings` declares it
            (``sync=True`` fixed).

    Raises:
        ConfigurationError: a bad argument, ``sync`` or ``credits``, a backend torch does not have here, or
            ``max_worker_restarts``.
    """

    @keyword_errors(refused=_DISTRIBUTED_SYNC_REFUSES)
    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_factory: Callable[[], PolicyLike] | str | None = None,
        device: Devices | None = None,
        env_device: Devices | None = None,
        policy_device: Devices | None = None,
        storing_device: Devices | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        env_errors: str = "raise",
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        trajs_per_batch: int | None = None,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        env_kwargs: Mapping[str, Any] | None = None,
        progress: bool | str = False,
        collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int | None = None,
        weight_sync_schemes: Mapping[str, WeightSyncScheme] | None = None,
        max_worker_restarts: int = 0,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 5.0,
        address: str | None = None,
        start_method: str = DEFAULT_START_METHOD,
        launcher: str | Launcher = "local",
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Keys | None = None,
        copy_batches: bool = False,
        max_lent_bytes: int | None = None,
        cuda_dma: bool = False,
        filter_worker_warnings: bool = True,
        num_workers: int | None = None,
        max_policy_lag: int | None = None,
        cat_results: str | int | None = None,
        backend: str = "gloo",
        tcp_port: int | None = None,
        init_method: str | None = None,
        master_addr: str = "127.0.0.1",
        dist_timeout: float = 60.0,
    ) -> None:
        self._join(create_env_fn, policy, settings_from(DistributedSettings, locals(), sync=True))
