"""The collector's side of its worker processes (see :mod:`acollect._pool.pool`)."""

from acollect._pool.handles import Received as Received
from acollect._pool.handles import Request as Request
from acollect._pool.handles import WorkerHandle as WorkerHandle
from acollect._pool.handles import WorkerState as WorkerState
from acollect._pool.pool import SHM_THRESHOLD as SHM_THRESHOLD
from acollect._pool.pool import WorkerPool as WorkerPool

__all__ = ["SHM_THRESHOLD", "Received", "Request", "WorkerHandle", "WorkerPool", "WorkerState"]
