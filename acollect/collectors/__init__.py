"""Collectors: async iterators of batches, one shared lifecycle."""

from typing import TYPE_CHECKING

from acollect.collectors.async_collector import AsyncCollector as AsyncCollector
from acollect.collectors.base import CollectorBase as CollectorBase
from acollect.collectors.base import CollectorState as CollectorState
from acollect.collectors.batched import AsyncBatchedCollector as AsyncBatchedCollector
from acollect.collectors.collector import Collector as Collector
from acollect.collectors.distributed import DistributedCollector as DistributedCollector
from acollect.collectors.distributed import DistributedSyncCollector as DistributedSyncCollector
from acollect.collectors.multi import MultiAsyncCollector as MultiAsyncCollector
from acollect.collectors.multi import MultiSyncCollector as MultiSyncCollector
from acollect.collectors.ray_collector import RayCollector as RayCollector
from acollect.transport.weight_sync import SharedMemWeightSyncScheme as SharedMemWeightSyncScheme
from acollect.transport.weight_sync import WeightSyncScheme as WeightSyncScheme
from acollect.transport.weight_sync import ZmqWeightSyncScheme as ZmqWeightSyncScheme

# TorchRL's spellings (SyncDataCollector, RPCCollector...) live in acollect.compat.torchrl, a layer above
# this package; old code that imports them from here still finds them, resolved on first use.
_COMPAT_NAMES = frozenset(
    {
        "BaseCollector",
        "DataCollectorBase",
        "DistributedDataCollector",
        "DistributedSyncDataCollector",
        "MultiSyncDataCollector",
        "MultiaSyncDataCollector",
        "RPCCollector",
        "RPCDataCollector",
        "SyncDataCollector",
        "aSyncDataCollector",
    }
)

if TYPE_CHECKING:
    from acollect.compat.torchrl import BaseCollector as BaseCollector
    from acollect.compat.torchrl import DataCollectorBase as DataCollectorBase
    from acollect.compat.torchrl import DistributedDataCollector as DistributedDataCollector
    from acollect.compat.torchrl import DistributedSyncDataCollector as DistributedSyncDataCollector
    from acollect.compat.torchrl import MultiaSyncDataCollector as MultiaSyncDataCollector
    from acollect.compat.torchrl import MultiSyncDataCollector as MultiSyncDataCollector
    from acollect.compat.torchrl import RPCCollector as RPCCollector
    from acollect.compat.torchrl import RPCDataCollector as RPCDataCollector
    from acollect.compat.torchrl import SyncDataCollector as SyncDataCollector
    from acollect.compat.torchrl import aSyncDataCollector as aSyncDataCollector


def __getattr__(name: str) -> object:
    if name in _COMPAT_NAMES:
        from acollect.compat import torchrl

        return getattr(torchrl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_COMPAT_NAMES})
