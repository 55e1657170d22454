"""acollect: asyncio-first reinforcement-learning data collection.

Every collector is an async iterator of TensorDict batches laid out as TorchRL's::

    async with Collector("CartPole-v1", policy, frames_per_batch=2048, total_frames=100_000) as collector:
        async for batch in collector:
            ...

This module only re-exports the public surface (``__all__``); see the submodules for the rest.
TorchRL's names (``SyncDataCollector``, ``MultiSyncDataCollector``, ``RPCCollector``...) import
from here too, for code written against TorchRL, but live in :mod:`acollect.compat.torchrl`.

The names load when first used (:pep:`562`): ``import acollect`` loads neither torch nor any
collector, so the ``acollect`` command answers ``--help`` at once, and ``from acollect import
Collector`` loads what ``Collector`` needs. They are listed once, as the re-exports of a
``TYPE_CHECKING`` block that type checkers read and this module reads (not runs) into the map
that loads them and into ``__all__``.
"""

import ast as _ast
import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# The public names, listed once, as re-exports. Type checkers and editors read these imports; at run time they
# do not run: _read_exports() reads them into _EXPORTS, the map by which __getattr__ loads each name on first
# use, and __all__ is made from it.
if _typing.TYPE_CHECKING:
    from acollect.collectors import AsyncBatchedCollector as AsyncBatchedCollector
    from acollect.collectors import AsyncCollector as AsyncCollector
    from acollect.collectors import Collector as Collector
    from acollect.collectors import CollectorBase as CollectorBase
    from acollect.collectors import CollectorState as CollectorState
    from acollect.collectors import DistributedCollector as DistributedCollector
    from acollect.collectors import DistributedSyncCollector as DistributedSyncCollector
    from acollect.collectors import MultiAsyncCollector as MultiAsyncCollector
    from acollect.collectors import MultiSyncCollector as MultiSyncCollector
    from acollect.collectors import RayCollector as RayCollector
    from acollect.collectors import SharedMemWeightSyncScheme as SharedMemWeightSyncScheme
    from acollect.collectors import WeightSyncScheme as WeightSyncScheme
    from acollect.collectors import ZmqWeightSyncScheme as ZmqWeightSyncScheme

    # TorchRL's spellings, for code written against TorchRL: importable from here, but kept out of __all__
    # (acollect's own surface); acollect.compat.torchrl documents them.
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
    from acollect.envs import EnvBase as EnvBase
    from acollect.envs import GymEnv as GymEnv
    from acollect.errors import AcollectError as AcollectError
    from acollect.errors import BackgroundCollectionError as BackgroundCollectionError
    from acollect.errors import ClosedCollectorError as ClosedCollectorError
    from acollect.errors import CollectorStateError as CollectorStateError
    from acollect.errors import ConfigurationError as ConfigurationError
    from acollect.errors import EmptyBufferError as EmptyBufferError
    from acollect.errors import EnvError as EnvError
    from acollect.errors import InferencePolicyError as InferencePolicyError
    from acollect.errors import InferenceServerError as InferenceServerError
    from acollect.errors import PolicyError as PolicyError
    from acollect.errors import ProtocolError as ProtocolError
    from acollect.errors import RemoteError as RemoteError
    from acollect.errors import TransportError as TransportError
    from acollect.errors import WeightSyncError as WeightSyncError
    from acollect.errors import WorkerCrashedError as WorkerCrashedError
    from acollect.errors import WorkerError as WorkerError
    from acollect.errors import WorkerTimeoutError as WorkerTimeoutError
    from acollect.inference import InferenceServer as InferenceServer
    from acollect.inference import InferenceStats as InferenceStats
    from acollect.launchers import submitit_delayed_launcher as submitit_delayed_launcher
    from acollect.replay_buffer import ReplayBuffer as ReplayBuffer
    from acollect.stats import CollectorStats as CollectorStats


#: Where TorchRL's spellings come from: names from this module stay out of ``__all__``.
_COMPAT_MODULE = "acollect.compat.torchrl"


def _read_exports() -> dict[str, str]:
    """Each name the ``TYPE_CHECKING`` block above re-exports, and the module it comes from: read, not run."""
    with open(__file__, encoding="utf-8") as source:
        tree = _ast.parse(source.read(), __file__)
    block = next(node for node in tree.body if isinstance(node, _ast.If))
    return {
        alias.name: str(node.module) for node in block.body if isinstance(node, _ast.ImportFrom) for alias in node.names
    }


#: Each name the package hands out, and the module it loads from.
_EXPORTS = _read_exports()

__all__ = ["__version__", *sorted(name for name, module in _EXPORTS.items() if module != _COMPAT_MODULE)]


def __getattr__(name: str) -> _typing.Any:
    """Imports ``name``'s module the first time ``name`` is asked for (``acollect.X``, ``from acollect import X``)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    """The names loaded so far and those that load on use."""
    return sorted({*globals(), *_EXPORTS})
