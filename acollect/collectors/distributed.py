"""Collectors whose batches and weights move over torch.distributed: :class:`DistributedCollector`
(``sync=False``: first ready, first served; ``sync=True``: lockstep) and :class:`DistributedSyncCollector`
(the same class with ``sync=True`` fixed).

They are the multi-process collectors with one change of road: control (commands,
heartbeats, batch headers, acknowledgements) stays on ZeroMQ, while the batch
tensors go worker -> collector with point-to-point sends and weight pushes go
collector -> workers with one broadcast, both through a torch.distributed process
group in which the collector is rank 0 and worker ``i`` is rank ``i + 1``
(:mod:`acollect.transport.torch_dist`; the pool that moves them is
:class:`acollect.pool.distributed.DistPool`). With ``backend="nccl"`` and CUDA batches,
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
from typing import Any

from typing_extensions import Unpack

from acollect._validate import check_int, check_seconds
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.dispatch import ModeOptions, dispatch_for
from acollect.collectors.options import WorkerOptions
from acollect.errors import ConfigurationError
from acollect.policy import PolicyLike
from acollect.pool import WorkerPool
from acollect.pool.distributed import DistPool
from acollect.pool.settings import PoolSettings
from acollect.transport.torch_dist import check_backend
from acollect.transport.weight_sync import WeightSyncScheme, ZmqWeightSyncScheme
from acollect.weights import WeightUpdate

__all__ = ["DistributedCollector", "DistributedSyncCollector"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class DistributedCollector(MultiCollectorBase):
    """Collects in worker processes whose batches and weights move over torch.distributed.

    One class, two modes: ``sync=False`` (default) takes batches as :class:`~acollect.MultiAsyncCollector`
    does (first ready, first served, each worker's batch tagged with its ``worker_id``); ``sync=True`` as
    :class:`~acollect.MultiSyncCollector` does (one part from every worker, all collected with the same
    weights, stacked or concatenated). The mode is the collector's dispatch strategy
    (:mod:`acollect.collectors.dispatch`); :class:`DistributedSyncCollector` is this class with
    ``sync=True`` fixed.

    Args:
        create_env_fn: one env factory per worker (a list), or one for ``num_workers`` workers.
        policy: the policy (see :class:`~acollect.MultiSyncCollector`).
        sync: lockstep batches from every worker (``True``), or first ready, first served (``False``).
        backend: ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank) or ``"mpi"``.
        tcp_port: port of the rendezvous on ``master_addr`` (default: a free one).
        init_method: a torch.distributed init URL instead (``"tcp://host:port"``, ``"file:///path"``).
        master_addr: the collector's address as the workers reach it (default ``127.0.0.1``).
        dist_timeout: seconds any torch.distributed wait may take (rendezvous, one batch, one broadcast);
            torch's own default is 30 minutes.
        **options: every other keyword argument of :class:`~acollect.MultiSyncCollector` (``frames_per_batch``,
            ``total_frames``, ``num_workers``, ``policy_factory``, devices, ``update_after_each_batch``...), with
            ``cat_results`` (``sync=True`` only: how worker batches combine) and ``credits`` (``sync=False``
            only: batches each worker may collect ahead, default 2).

    Raises:
        ConfigurationError: a bad argument, the other mode's option, a backend torch does not have here, or
            ``max_worker_restarts``.
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        sync: bool = False,
        backend: str = "gloo",
        tcp_port: int | None = None,
        init_method: str | None = None,
        master_addr: str = "127.0.0.1",
        dist_timeout: float = 60.0,
        **options: Unpack[ModeOptions],
    ) -> None:
        opts: dict[str, Any] = dict(options)
        dispatch = dispatch_for(sync, opts)
        backend = check_backend(backend)
        check_int("tcp_port", tcp_port, minimum=1, maximum=65535, optional=True)
        if init_method is not None and (tcp_port is not None or not isinstance(init_method, str)):
            raise ConfigurationError.bad_value(
                "init_method", init_method, "None (then tcp://master_addr:tcp_port), or a URL without tcp_port"
            )
        timeout = check_seconds("dist_timeout", dist_timeout)
        if opts.get("max_worker_restarts", 0) != 0:
            raise ConfigurationError.bad_value(
                "max_worker_restarts", opts["max_worker_restarts"],
                "0: a torch.distributed process group cannot take a restarted worker in",
            )  # fmt: skip
        if init_method is None:
            init_method = f"tcp://{master_addr}:{tcp_port or _free_port(master_addr)}"
        self.backend = backend
        self.init_method = init_method
        self._dist_options = {"backend": backend, "init_method": init_method, "timeout": timeout}
        super().__init__(create_env_fn, policy, opts, dispatch=dispatch)

    def _new_pool(self, settings: PoolSettings) -> WorkerPool:
        return DistPool(self._configs, settings, on_failure=self._fail, dist_options=self._dist_options)

    def _default_scheme(self) -> WeightSyncScheme:
        return ZmqWeightSyncScheme()  # flat buffers, which the broadcast carries

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
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        backend: str = "gloo",
        tcp_port: int | None = None,
        init_method: str | None = None,
        master_addr: str = "127.0.0.1",
        dist_timeout: float = 60.0,
        cat_results: str | int | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        if "sync" in options:  # not in WorkerOptions, so mypy flags it; this is for untyped callers
            raise ConfigurationError.bad_value(
                "sync", options["sync"],  # type: ignore[typeddict-item]
                "no value: a DistributedSyncCollector is sync=True (DistributedCollector takes sync=...)",
            )  # fmt: skip
        super().__init__(
            create_env_fn, policy, sync=True, backend=backend, tcp_port=tcp_port, init_method=init_method,
            master_addr=master_addr, dist_timeout=dist_timeout, cat_results=cat_results, **options,
        )  # fmt: skip
