"""The collectors' ``**options`` as ``TypedDict`` s, for mypy, generated from their declarations.

Do not edit: each option is declared once, in :mod:`acollect.collectors.options`. After changing a
declaration, regenerate this module:
``python -c "from acollect.collectors.option_codegen import write_option_types; write_option_types()"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from typing_extensions import Required, TypedDict

from acollect.devices import DeviceLike
from acollect.policy import PolicyLike
from acollect.transport.auth import ServerKeys
from acollect.transport.weight_sync import WeightSyncScheme

__all__ = ["Devices", "InProcessOptions", "ProcessOptions", "RolloutOptions", "WorkerOptions"]

Devices = DeviceLike | Sequence[DeviceLike]
"""One device, or (multi-process collectors) a list with one per worker."""


class RolloutOptions(TypedDict, total=False):
    """The keyword options every collector takes."""

    #: frames per batch (rounded up to a multiple of the envs)
    frames_per_batch: Required[int]

    #: frames to collect in all, -1 endless (checked by CollectorBase)
    total_frames: int

    #: builds the policy where it runs (instead of a policy)
    policy_factory: Callable[[], PolicyLike] | str | None

    #: env, policy and storing device at once
    device: Devices

    #: where the env steps
    env_device: Devices

    #: where the policy runs
    policy_device: Devices

    #: where batches are written
    storing_device: Devices

    #: truncate longer episodes
    max_frames_per_traj: int | None

    #: act randomly until this many frames
    init_random_frames: int | None

    #: reset every env at each batch
    reset_at_each_iter: bool

    #: applied to each batch before it is handed out
    postproc: Callable[[TensorDictBase], TensorDictBase] | None

    #: split batches into padded trajectories
    split_trajs: bool

    #: tensordict interaction type while collecting
    exploration_type: InteractionType | str | None

    #: keyword arguments of the env factory
    env_kwargs: Mapping[str, Any] | None

    #: a progress bar: True, "tqdm" or "log" (checked by CollectorBase)
    progress: bool | str


class InProcessOptions(RolloutOptions, total=False):
    """The options of the in-process ``Collector``."""

    #: seconds between offers of the GIL to the event loop at step boundaries (0: every step, None: never)
    gil_handover_interval: float | None


class ProcessOptions(RolloutOptions, total=False):
    """The options of collectors whose envs run in worker processes, but for ``num_workers``."""

    #: options per worker: one dict for all, or a list of dicts
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: push the policy's weights after each batch
    update_after_each_batch: bool

    #: push the policy's weights at least every this many batches
    max_weight_update_interval: int | None

    #: how each model's weights travel (model id -> scheme)
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None

    #: restarts allowed per worker before a failure is raised
    max_worker_restarts: int

    #: seconds without progress before a worker hangs
    heartbeat_timeout: float

    #: seconds a worker may take to start
    startup_timeout: float

    #: seconds async_shutdown() takes at most
    shutdown_timeout: float

    #: where workers connect: ipc:// or tcp:// (None: private)
    address: str | None

    #: "spawn" or "forkserver"
    start_method: str

    #: where workers run: a launcher or its name (checked with start_method)
    launcher: Any

    #: torch threads per worker
    num_threads: int

    #: batches through /dev/shm slots (None: by size and address)
    use_shared_memory: bool | None

    #: workers started by hand that join over tcp
    remote_workers: int

    #: CURVE keys: workers must authenticate (a key directory from `acollect keys`)
    keys: ServerKeys | str | os.PathLike[str] | None

    #: hand out copies of the workers' shared memory (False: lend it, given back once the caller drops the batch)
    copy_batches: bool

    #: shared memory lent at most, in bytes (beyond it: copies; None: 1 GiB or a quarter of /dev/shm)
    max_lent_bytes: int | None

    #: silence Python warnings in the workers
    filter_worker_warnings: bool


class WorkerOptions(ProcessOptions, total=False):
    """The options of the multi-process collectors."""

    #: worker processes (with one env factory)
    num_workers: int | None
