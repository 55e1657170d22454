"""The state every part of :class:`~acollect.pool.pool.WorkerPool` shares, declared once.

The pool's jobs live in separate modules (receiving, liveness, weights), each a
mixin over this base; the attributes and the few methods they call on each other
are declared here, so each module type-checks on its own and the shared state
has one list.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
from tensordict import TensorDictBase

from acollect._notify import Notifier
from acollect.launchers.base import Launcher
from acollect.pool.handles import Received, WorkerHandle
from acollect.transport.auth import ServerKeys
from acollect.transport.endpoint import Endpoint
from acollect.transport.weight_sync import WeightWriter

__all__ = ["PoolBase"]

T = TypeVar("T")


class PoolBase:
    """Declarations shared by the pool's parts (see :class:`~acollect.pool.pool.WorkerPool`)."""

    handles: list[WorkerHandle]
    keys: ServerKeys | None
    launcher: Launcher
    address: str | None
    credits: int | None
    slots: int | None
    changes_sent: int
    use_shared_memory: bool | None
    heartbeat_timeout: float
    startup_timeout: float
    max_restarts: int
    endpoint: Endpoint | None
    failure: BaseException | None
    ready_queue: deque[Received]
    dropped_batches: int
    discarded_frames: int
    rejected_messages: int
    running: bool
    paused: bool
    version: int
    _writers: dict[str, WeightWriter]
    _last_weights: tuple[dict[str, Any], TensorDictBase | None] | None
    _weights_lock: anyio.Lock
    _changes: Notifier
    _closed: bool

    def _notify(self) -> None:
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _vacate(self, handle: WorkerHandle) -> None:
        raise NotImplementedError

    async def _spawn(self, handle: WorkerHandle) -> None:
        raise NotImplementedError

    def _wants_shm(self, nbytes: int) -> bool:
        raise NotImplementedError

    async def send(
        self, handle: WorkerHandle, kind: str, fields: Mapping[str, Any] | None = None, td: TensorDictBase | None = None
    ) -> None:
        raise NotImplementedError

    async def wait_until(self, predicate: Callable[[], T], *, limit: float | None = None, what: str = "") -> T:
        raise NotImplementedError
