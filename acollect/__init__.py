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
Collector`` loads what ``Collector`` needs.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# Each name the package hands out, and the module it comes from.
_EXPORTS: dict[str, str] = {
    "AsyncBatchedCollector": "acollect.collectors",
    "AsyncCollector": "acollect.collectors",
    "Collector": "acollect.collectors",
    "CollectorBase": "acollect.collectors",
    "CollectorState": "acollect.collectors",
    "DistributedCollector": "acollect.collectors",
    "DistributedSyncCollector": "acollect.collectors",
    "MultiAsyncCollector": "acollect.collectors",
    "MultiSyncCollector": "acollect.collectors",
    "RayCollector": "acollect.collectors",
    "SharedMemWeightSyncScheme": "acollect.collectors",
    "WeightSyncScheme": "acollect.collectors",
    "ZmqWeightSyncScheme": "acollect.collectors",
    # TorchRL's spellings, for code written against TorchRL: importable from here, kept out of __all__
    # (acollect's own surface). They are documented in acollect.compat.torchrl.
    "BaseCollector": "acollect.compat.torchrl",
    "DataCollectorBase": "acollect.compat.torchrl",
    "DistributedDataCollector": "acollect.compat.torchrl",
    "DistributedSyncDataCollector": "acollect.compat.torchrl",
    "MultiaSyncDataCollector": "acollect.compat.torchrl",
    "MultiSyncDataCollector": "acollect.compat.torchrl",
    "RPCCollector": "acollect.compat.torchrl",
    "RPCDataCollector": "acollect.compat.torchrl",
    "SyncDataCollector": "acollect.compat.torchrl",
    "aSyncDataCollector": "acollect.compat.torchrl",
    "EnvBase": "acollect.envs",
    "GymEnv": "acollect.envs",
    "AcollectError": "acollect.errors",
    "BackgroundCollectionError": "acollect.errors",
    "ClosedCollectorError": "acollect.errors",
    "CollectorStateError": "acollect.errors",
    "ConfigurationError": "acollect.errors",
    "EmptyBufferError": "acollect.errors",
    "EnvError": "acollect.errors",
    "InferencePolicyError": "acollect.errors",
    "InferenceServerError": "acollect.errors",
    "PolicyError": "acollect.errors",
    "ProtocolError": "acollect.errors",
    "RemoteError": "acollect.errors",
    "TransportError": "acollect.errors",
    "WeightSyncError": "acollect.errors",
    "WorkerCrashedError": "acollect.errors",
    "WorkerError": "acollect.errors",
    "WorkerTimeoutError": "acollect.errors",
    "InferenceServer": "acollect.inference",
    "InferenceStats": "acollect.inference",
    "submitit_delayed_launcher": "acollect.launchers",
    "ReplayBuffer": "acollect.replay_buffer",
    "CollectorStats": "acollect.stats",
}

if _typing.TYPE_CHECKING:  # the same names, for type checkers and editors (tests/test_public_api.py keeps them equal)
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

__all__ = [
    "AcollectError",
    "AsyncBatchedCollector",
    "AsyncCollector",
    "BackgroundCollectionError",
    "ClosedCollectorError",
    "Collector",
    "CollectorBase",
    "CollectorState",
    "CollectorStateError",
    "CollectorStats",
    "ConfigurationError",
    "DistributedCollector",
    "DistributedSyncCollector",
    "EmptyBufferError",
    "EnvBase",
    "EnvError",
    "GymEnv",
    "InferencePolicyError",
    "InferenceServer",
    "InferenceServerError",
    "InferenceStats",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "PolicyError",
    "ProtocolError",
    "RayCollector",
    "RemoteError",
    "ReplayBuffer",
    "SharedMemWeightSyncScheme",
    "TransportError",
    "WeightSyncError",
    "WeightSyncScheme",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerTimeoutError",
    "ZmqWeightSyncScheme",
    "__version__",
    "submitit_delayed_launcher",
]


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
