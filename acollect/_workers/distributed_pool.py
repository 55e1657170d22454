"""A worker pool whose batch tensors and weights travel through torch.distributed.

Control (commands, heartbeats, batch headers, acknowledgements) stays on the pool's
ZeroMQ endpoint; a batch's tensors go worker -> collector with point-to-point sends
and a weight push goes collector -> workers with one broadcast, through a process
group in which the collector is rank 0 and worker ``i`` is rank ``i + 1``
(:mod:`acollect._runtime.torch_dist`). :class:`~acollect.DistributedCollector` uses it.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDictBase

from acollect._runtime.tasks import TaskOwner
from acollect._runtime.threads import run_in_thread
from acollect._runtime.torch_dist import init_groups, wait_all
from acollect._runtime.wire import decode_tensordict
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle
from acollect._workers.pool import WorkerPool
from acollect._workers.pool_settings import PoolSettings
from acollect.errors import CollectorStateError

__all__ = ["DistPool"]


class _Group(enum.Enum):
    """The process group a :class:`DistPool` made, as far as it got."""

    NONE = "none"  # not made (or destroyed): nothing of ours to destroy
    FORMING = "forming"  # ours from here on (start() refused a group that existed before), not formed yet
    READY = "ready"  # formed: weights are broadcast through it


class DistPool(WorkerPool):
    """A worker pool whose batch tensors and weights travel through torch.distributed."""

    weights_through_shm = False  # flat buffers, which the broadcast carries

    def __init__(
        self,
        configs: Sequence[P.WorkerConfig],
        settings: PoolSettings,
        *,
        on_failure: Callable[[BaseException], None] | None = None,
        dist_options: dict[str, Any],
    ) -> None:
        super().__init__(configs, settings, on_failure=on_failure)
        self.dist_options = dist_options
        self._group = _Group.NONE
        self._weights_group: Any = None
        self._broadcasts: list[Any] = []  # the last push's broadcast works (and their buffers)
        self._broadcast_version = -1

    def _wants_shm(self, nbytes: int) -> bool:
        return False  # the tensors come through the process group

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
        self._group = _Group.FORMING
        self._weights_group = await run_in_thread(lambda _stop: init(), name="dist-init")
        self._group = _Group.READY

    @property
    def device(self) -> torch.device:
        return torch.device("cuda") if self.dist_options["backend"] == "nccl" else torch.device("cpu")

    def _recv_batch(self, handle: WorkerHandle, stop: threading.Event) -> TensorDictBase:
        layout = handle.hello.layout
        assert layout is not None
        leaves = layout["leaves"]
        td: TensorDictBase = decode_tensordict(layout, [bytearray(int(leaf["nbytes"])) for leaf in leaves])
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
        if kind != P.WEIGHTS or td is None or self._group is not _Group.READY:
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
        self._end_group()

    def abandon(self) -> None:
        super().abandon()
        self._end_group()

    def _end_group(self) -> None:
        self._broadcasts = []
        if self._group is _Group.NONE:
            return
        if dist.is_initialized():
            self._group = _Group.NONE
            dist.destroy_process_group()
        else:  # still ours, not formed yet (a start cancelled while it forms): a later end destroys it
            self._group = _Group.FORMING
