"""TorchRL's collector names, current and legacy, as aliases of the matching acollect classes.

Code written for TorchRL imports its collectors under these names; each alias is the
acollect class itself (not a subclass), so ``isinstance`` checks and docs agree. The
arguments are TorchRL's where the concepts match: see ``docs/migrating-from-torchrl.md``.

Examples:
    >>> from acollect import MultiSyncCollector, MultiSyncDataCollector
    >>> MultiSyncDataCollector is MultiSyncCollector
    True
"""

from __future__ import annotations

from acollect.collectors.async_collector import AsyncCollector
from acollect.collectors.base import CollectorBase
from acollect.collectors.collector import Collector
from acollect.collectors.distributed import DistributedCollector, DistributedSyncCollector
from acollect.collectors.multi import MultiAsyncCollector, MultiSyncCollector
from acollect.collectors.rpc import RPCCollector

__all__ = [
    "BaseCollector",
    "DataCollectorBase",
    "DistributedDataCollector",
    "DistributedSyncDataCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "RPCDataCollector",
    "SyncDataCollector",
    "aSyncDataCollector",
]

# -- one process, in-process collection --------------------------------------------------
#: TorchRL's legacy name of :class:`~acollect.Collector`.
SyncDataCollector = Collector

# -- worker processes on this machine (or wherever ``launcher=`` puts them) ------------------
#: TorchRL's legacy name of :class:`~acollect.MultiSyncCollector`.
MultiSyncDataCollector = MultiSyncCollector
#: TorchRL's legacy name of :class:`~acollect.MultiAsyncCollector`.
MultiaSyncDataCollector = MultiAsyncCollector
#: TorchRL's legacy name of :class:`~acollect.AsyncCollector`.
aSyncDataCollector = AsyncCollector

# -- the shared base ------------------------------------------------------------------------
#: TorchRL's name of the base every collector derives from (:class:`~acollect.CollectorBase`).
DataCollectorBase = CollectorBase
#: TorchRL's newer name of that base.
BaseCollector = CollectorBase

# -- across machines ------------------------------------------------------------------------
# RayCollector and submitit_delayed_launcher keep TorchRL's names as they are (acollect.RayCollector,
# acollect.submitit_delayed_launcher).
#: TorchRL's legacy name of :class:`~acollect.DistributedCollector`.
DistributedDataCollector = DistributedCollector
#: TorchRL's legacy name of :class:`~acollect.DistributedSyncCollector`.
DistributedSyncDataCollector = DistributedSyncCollector
#: TorchRL's legacy name of :class:`~acollect.RPCCollector`.
RPCDataCollector = RPCCollector
