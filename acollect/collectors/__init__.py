"""Collectors: async iterators of batches, one shared lifecycle.

TorchRL's spellings of these classes (``SyncDataCollector``, ``RPCCollector``...) live in
:mod:`acollect.compat.torchrl`, a layer above this package, and import from ``acollect`` too; this
package never imports them, so it stays below the compatibility layer.

Each collector's signature names every keyword it takes; each option is declared once, with its check and
its doc, in :mod:`acollect.collectors._options` and :mod:`acollect.collectors._collector_settings` (the
options reference, ``docs/options.md``, is rendered from them).
"""

from acollect._weights.sync import SharedMemWeightSyncScheme as SharedMemWeightSyncScheme
from acollect._weights.sync import WeightSyncScheme as WeightSyncScheme
from acollect._weights.sync import ZmqWeightSyncScheme as ZmqWeightSyncScheme
from acollect.collectors._async_collector import AsyncCollector as AsyncCollector
from acollect.collectors._base import CollectorBase as CollectorBase
from acollect.collectors._base import CollectorState as CollectorState
from acollect.collectors._batched import AsyncBatchedCollector as AsyncBatchedCollector
from acollect.collectors._collector import Collector as Collector
from acollect.collectors._distributed import DistributedCollector as DistributedCollector
from acollect.collectors._distributed import DistributedSyncCollector as DistributedSyncCollector
from acollect.collectors._multi import MultiAsyncCollector as MultiAsyncCollector
from acollect.collectors._multi import MultiSyncCollector as MultiSyncCollector
from acollect.collectors._ray_collector import RayCollector as RayCollector
