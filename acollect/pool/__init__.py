"""The collector's side of its worker processes (see :mod:`acollect.pool.pool`)."""

from acollect.pool.handles import Received as Received
from acollect.pool.handles import Request as Request
from acollect.pool.handles import WorkerHandle as WorkerHandle
from acollect.pool.handles import WorkerState as WorkerState
from acollect.pool.pool import SHM_THRESHOLD as SHM_THRESHOLD
from acollect.pool.pool import WorkerPool as WorkerPool

__all__ = ["SHM_THRESHOLD", "Received", "Request", "WorkerHandle", "WorkerPool", "WorkerState"]
