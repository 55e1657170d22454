"""Collectors: async iterators of batches, one shared lifecycle."""

from acollect.collectors.aliases import BaseCollector as BaseCollector
from acollect.collectors.aliases import DataCollectorBase as DataCollectorBase
from acollect.collectors.aliases import DistributedDataCollector as DistributedDataCollector
from acollect.collectors.aliases import DistributedSyncDataCollector as DistributedSyncDataCollector
from acollect.collectors.aliases import MultiaSyncDataCollector as MultiaSyncDataCollector
from acollect.collectors.aliases import MultiSyncDataCollector as MultiSyncDataCollector
from acollect.collectors.aliases import RPCDataCollector as RPCDataCollector
from acollect.collectors.aliases import SyncDataCollector as SyncDataCollector
from acollect.collectors.aliases import aSyncDataCollector as aSyncDataCollector
from acollect.collectors.async_collector import AsyncCollector as AsyncCollector
from acollect.collectors.base import CollectorBase as CollectorBase
from acollect.collectors.base import CollectorState as CollectorState
from acollect.collectors.collector import Collector as Collector
from acollect.collectors.distributed import DistributedCollector as DistributedCollector
from acollect.collectors.distributed import DistributedSyncCollector as DistributedSyncCollector
from acollect.collectors.multi import MultiAsyncCollector as MultiAsyncCollector
from acollect.collectors.multi import MultiSyncCollector as MultiSyncCollector
from acollect.collectors.ray_collector import RayCollector as RayCollector
from acollect.collectors.rpc import RPCCollector as RPCCollector
from acollect.transport.weight_sync import SharedMemWeightSyncScheme as SharedMemWeightSyncScheme
from acollect.transport.weight_sync import WeightSyncScheme as WeightSyncScheme
from acollect.transport.weight_sync import ZmqWeightSyncScheme as ZmqWeightSyncScheme
