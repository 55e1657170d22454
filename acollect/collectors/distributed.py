"""Collectors whose batches and weights move over torch.distributed: :class:`DistributedCollector`
(``sync=False``: first ready, first served; ``sync=True``: lockstep) and :class:`DistributedSyncCollector`
(the same class with ``sync=True`` fixed).

They are the multi-process collectors with one change of road: control (commands,
heartbeats, batch headers, acknowledgements) stays on ZeroMQ, while the batch
tensors go worker -> collector with point-to-point sends and weight pushes go
collector -> workers with one broadcast, both through a torch.distributed process
group in which the collector is rank 0 and worker ``i`` is rank ``i + 1``
(:mod:`acollect.transport.torch_dist`). With ``backend="nccl"`` and CUDA batches,
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

import socket
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDictBase
from typing_extensions import Unpack

from acollect._tasks import TaskOwner
from acollect._threads import run_in_thread
from acollect._validate import check_int, check_seconds
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.dispatch import ModeOptions, dispatch_for
from acollect.collectors.options import WorkerOptions
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.policy import PolicyLike
from acollect.pool import WorkerHandle, WorkerPool
from acollect.transport.torch_dist import check_backend, init_groups, wait_all
from acollect.transport.weight_sync import WeightSyncScheme, ZmqWeightSyncScheme
from acollect.transport.wire import decode_tensordict
from acollect.worker import protocol as P

__all__ = ["DistributedCollector", "DistributedSyncCollector"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _DistPool(WorkerPool):
    """A worker pool whose batch tensors and weights travel through torch.distributed."""

    def __init__(self, *args: Any, dist_options: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dist_options = dist_options
        self.dist_ready = False
        self._owns_group = False
        self._weights_group: Any = None
        self._broadcasts: list[Any] = []  # the last push's broadcast works (and their buffers)
        self._broadcast_version = -1

    def _wants_shm(self, nbytes: int) -> bool:
        return False  # the tensors take the process group's road

    async def start(self, owner: TaskOwner) -> None:
        if dist.is_initialized():
            raise CollectorStateError(
                "torch.distributed is initialized in this process already (another distributed collector, or "
                "your own process group): one distributed collector per process"
            )
        await super().start(owner)
        o = self.dist_options
        fields = {k: o[k] for k in ("backend", "init_method", "timeout")}
        world_size = len(self.handles) + 1
        for handle in self.handles:
            await self.send(handle, P.DIST_INIT, {**fields, "rank": handle.index + 1, "world_size": world_size})
        init = partial(init_groups, o["backend"], o["init_method"], 0, len(self.handles) + 1, o["timeout"])
        # Ours from here on (start() refused a group that existed before): a start cancelled while the
        # group forms still destroys it at close, or it would refuse every later distributed collector.
        self._owns_group = True
        self._weights_group = await run_in_thread(lambda _stop: init(), name="dist-init")
        self.dist_ready = True

    @property
    def device(self) -> torch.device:
        return torch.device("cuda") if self.dist_options["backend"] == "nccl" else torch.device("cpu")

    def _recv_batch(self, handle: WorkerHandle, stop: threading.Event) -> TensorDictBase:
        assert handle.layout is not None
        leaves = handle.layout["leaves"]
        td: TensorDictBase = decode_tensordict(handle.layout, [bytearray(int(leaf["nbytes"])) for leaf in leaves])
        if self.device.type != "cpu":
            td = td.to(self.device)
        tensors = [td.get(tuple(leaf["key"])) for leaf in leaves]
        works = [dist.irecv(t, src=handle.index + 1, tag=i) for i, t in enumerate(tensors)]
        wait_all(works, stop=stop, timeout=self.dist_options["timeout"], what=f"a batch from worker {handle.index}")
        return td

    async def _batch_data(
        self, handle: WorkerHandle, header: dict[str, Any], td: TensorDictBase | None
    ) -> TensorDictBase | None:
        if header.get("dist"):  # its tensors follow through the process group
            return await run_in_thread(partial(self._recv_batch, handle), name="dist-recv")
        return td

    async def send(
        self, handle: WorkerHandle, kind: str, fields: Mapping[str, Any] | None = None, td: TensorDictBase | None = None
    ) -> None:
        if kind != P.WEIGHTS or td is None or not self.dist_ready:
            await super().send(handle, kind, fields, td)
            return
        fields = dict(fields or {})
        version = int(fields["version"])
        if version != self._broadcast_version:
            # One broadcast per push, started with the first header: rank 0 sends while the
            # workers, told by their header, receive; they acknowledge once they have it.
            previous, self._broadcasts = self._broadcasts, []
            timeout = self.dist_options["timeout"]
            await run_in_thread(
                lambda stop: wait_all([w for w, _ in previous], stop=stop, timeout=timeout, what="a weight broadcast"),
                name="dist-weights",
            )
            for i in range(len(fields["models"])):
                flat = td.get(f"m{i}").to(self.device)
                self._broadcasts.append((dist.broadcast(flat, src=0, group=self._weights_group, async_op=True), flat))
            self._broadcast_version = version
        await super().send(handle, kind, {**fields, "dist": True})

    async def close(self, limit: float) -> None:
        await super().close(limit)
        self._broadcasts = []
        self.dist_ready = False
        if self._owns_group and dist.is_initialized():
            self._owns_group = False
            dist.destroy_process_group()


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

    def _new_pool(self, *args: Any, **kwargs: Any) -> WorkerPool:
        return _DistPool(*args, dist_options=self._dist_options, **kwargs)

    def _default_scheme(self) -> WeightSyncScheme:
        return ZmqWeightSyncScheme()  # flat buffers, which the broadcast carries

    async def update_policy_weights_(self, *args: Any, worker_ids: Sequence[int] | None = None, **kwargs: Any) -> int:
        """As :meth:`acollect.MultiSyncCollector.update_policy_weights_`, for every worker at once."""
        if worker_ids is not None and sorted(set(worker_ids)) != list(range(self.num_workers)):
            raise ConfigurationError.bad_value(
                "worker_ids", worker_ids, "None: a weight broadcast reaches every worker of the process group"
            )
        return await super().update_policy_weights_(*args, **kwargs)


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
