"""The collectors' ``**options`` as ``TypedDict`` s, for mypy, generated from their declarations.

Do not edit: each option is declared once, in :mod:`acollect.collectors.options` or
:mod:`acollect.collectors.collector_settings`. After changing a declaration, regenerate this module (and
the collectors' docstrings):
``python -c "from acollect.collectors.option_codegen import write_all; write_all()"``.
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

__all__ = [
    "AsyncOptions",
    "BatchedOptions",
    "Devices",
    "DistributedOptions",
    "DistributedSyncOptions",
    "InProcessOptions",
    "ModeOptions",
    "MultiAsyncOptions",
    "MultiSyncOptions",
    "ProcessOptions",
    "RayOptions",
    "RolloutOptions",
    "WorkerOptions",
]

Devices = DeviceLike | Sequence[DeviceLike]
"""One device, or (multi-process collectors) a list with one per worker."""


class RolloutOptions(TypedDict, total=False):
    """The keyword options every collector takes."""

    #: frames in each batch handed out: from every worker together where a batch holds a part from each
    #: (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or worker. Rounded up
    #: to a multiple of the number of envs, so that every env steps equally often (with a warning):
    #: ``collector.frames_per_batch`` then says what each batch holds, ``collector.requested_frames_per_batch`` what was
    #: asked.
    frames_per_batch: Required[int]

    #: frames to collect in all, after which iteration ends; ``-1`` collects forever.
    total_frames: int

    #: a zero-argument callable building the policy where it runs, instead of ``policy`` (for a policy that does not
    #: pickle). Multi-process collectors also take an import path ``'module:name'``, which each worker imports.
    policy_factory: Callable[[], PolicyLike] | str | None

    #: fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the multi-process
    #: collectors take a list too, with one device per worker.
    device: Devices

    #: where env data lives; the multi-process collectors take a list too, with one device per worker.
    env_device: Devices

    #: where the policy runs (data is cast between it and the env device); the multi-process collectors take a list too,
    #: with one device per worker.
    policy_device: Devices

    #: where batches land; the multi-process collectors take a list too, with one device per worker.
    storing_device: Devices

    #: truncate (``truncated=True``) and reset trajectories longer than this; ``None``: no limit.
    max_frames_per_traj: int | None

    #: act randomly for this many frames first (``None``: 0).
    init_random_frames: int | None

    #: reset every env at the start of each batch.
    reset_at_each_iter: bool

    #: what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector with it (from a
    #: worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env from its factory (a
    #: vector env whole), where it runs (a worker process stays up), ends the episodes in flight as truncated at their
    #: last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the failed step yields no frame, and
    #: the next frames start new trajectories from a reset), counts it in ``stats().env_restarts`` and logs a warning
    #: with the exception on the ``acollect`` logger. An env that fails again after 3 rebuilds in a row with no step
    #: taken between them (its factory raises, or it raises before its first step each time) breaks the collector with
    #: its last exception. ``"restart"`` needs an env factory or a gymnasium id (not an env instance); the coroutine
    #: envs of an ``AsyncEnvPool`` are rebuilt one by one, by the pool, each ending its own episode.
    env_errors: str

    #: a callable applied to each batch before it is handed out, in this process (in the collection thread, for
    #: ``Collector``).
    postproc: Callable[[TensorDictBase], TensorDictBase] | None

    #: hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of ``[n_envs, T]``
    #: batches.
    split_trajs: bool

    #: hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the longest, with a boolean
    #: ``("collector", "mask")`` (True on real frames), in the order they ended. Workers still collect
    #: ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames collected; when they are
    #: reached, the episodes in progress are handed out cut, truncated at their last frame (the last batch may hold
    #: fewer than N). ``None``: ``[n_envs, T]`` batches.
    trajs_per_batch: int | None

    #: tensordict interaction type used while collecting (an ``InteractionType`` or its name, such as ``"mode"``); set
    #: per collection thread and per worker, so collectors never change each other's.
    exploration_type: InteractionType | str | None

    #: keyword arguments of the env factory, or of the env a gymnasium id names (such as ``{"num_envs": 8}``).
    env_kwargs: Mapping[str, Any] | None

    #: show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm bar if tqdm is installed,
    #: else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``, ``"log"`` or ``False`` (nothing
    #: shown). Workers count their episodes and send them with each batch.
    progress: bool | str


class InProcessOptions(RolloutOptions, total=False):
    """The options of the in-process ``Collector``."""

    #: the collection thread shares the GIL with the event loop; between two env steps it offers the GIL to the loop
    #: (``acollect._threads.GilHandover``) if this many seconds passed since its last offer, so the loop waits about
    #: this long plus one step for it each time (``0``: at every step; ``None``: never, as threads do by themselves: the
    #: loop may then wait several 5 ms switch intervals). A trainer that keeps the GIL busy on the loop gets a larger
    #: share of it, and collection a smaller one (``docs/concepts.md``, background mode).
    gil_handover_interval: float | None


class ProcessOptions(RolloutOptions, total=False):
    """The options of collectors whose envs run in worker processes, but for ``num_workers``."""

    #: options per worker: one dict for every worker, or a list of dicts with one per worker, among ``device``,
    #: ``env_device``, ``env_errors``, ``env_kwargs``, ``exploration_type``, ``init_random_frames``,
    #: ``max_frames_per_traj``, ``num_threads``, ``policy_device``, ``reset_at_each_iter``, ``storing_device``.
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: push the weights of ``policy`` (this process's copy) after every batch.
    update_after_each_batch: bool

    #: push the weights of ``policy`` at least every this many batches (``None``: when asked only).
    max_weight_update_interval: int | None

    #: how each model's weights travel: model id -> ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()``
    #: (default: through shared memory to workers on this host, else over the endpoint).
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None

    #: restarts allowed per worker; ``0`` raises on the first crash.
    max_worker_restarts: int

    #: what a worker lost for good does to the collector (one that dies with its ``max_worker_restarts`` spent, or a
    #: worker started by hand that leaves and is not replaced): ``"raise"`` breaks the collector with the worker's
    #: error; ``"continue"`` drops the worker (a warning on the ``"acollect"`` logger, ``stats().lost_workers``, its
    #: state ``LOST``) and collects on with the others, a lockstep batch then holding the live workers' parts only; the
    #: collector breaks when no worker is left. It applies once every worker started.
    on_worker_loss: str

    #: seconds a collecting worker may make no env step (or any worker send no heartbeat) before it counts as hung; a
    #: worker with no parent process to watch (started by hand, or on another host) exits after as long without a word
    #: from its collector.
    heartbeat_timeout: float

    #: seconds a worker may take to start and build its env and policy (or to join, for one started by hand).
    startup_timeout: float

    #: seconds :meth:`async_shutdown` takes at most, unless it is given a timeout.
    shutdown_timeout: float

    #: ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which workers connect to (``None``:
    #: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's address>:<free port>``).
    address: str | None

    #: how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
    start_method: str

    #: where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each), ``"submitit"`` (one
    #: submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)`` (see
    #: ``acollect.launchers``); checked together with ``start_method``.
    launcher: Any

    #: torch threads in each worker.
    num_threads: int

    #: move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or more on a local address).
    use_shared_memory: bool | None

    #: how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys DIR``, on any machine)
    #: instead of by the collector: the last ones. The collector waits up to ``startup_timeout`` for them to join. Needs
    #: ``address`` and ``keys``.
    remote_workers: int

    #: a key directory written by ``acollect keys`` (or a ``ServerKeys``): the endpoint then encrypts every connection
    #: with CURVE and accepts only the workers whose public key is in its ``authorized/`` directory; others are refused
    #: and counted in ``rejected_peers``.
    keys: ServerKeys | str | os.PathLike[str] | None

    #: ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and never written while any
    #: tensor of it is held (a view, a slice, a numpy array of one), then given back to its worker (see
    #: ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once.
    copy_batches: bool

    #: the most shared memory lent to the caller at once, in bytes: beyond it a batch is handed out as a copy (its
    #: memory given back at once), so a caller keeping every batch never stalls collection. ``None``: 1 GiB, or a
    #: quarter of ``/dev/shm`` where that is less.
    max_lent_bytes: int | None

    #: ignore Python warnings inside the workers (an env's deprecation warnings, repeated by every worker, would drown
    #: the trainer's output); ``False`` lets them through to the workers' stderr.
    filter_worker_warnings: bool


class WorkerOptions(ProcessOptions, total=False):
    """The options of the multi-process collectors."""

    #: the number of workers where ``create_env_fn_list`` is one factory (default: the CPU count).
    num_workers: int | None

    #: the cores each worker process runs on (Linux; refused where ``os.sched_setaffinity`` is missing, such as macOS).
    #: ``None`` (default): nothing is pinned, the OS places every process. ``"auto"``: worker ``i`` gets the ``i``-th
    #: core this process may use (``os.sched_getaffinity(0)`` at construction, round-robin when there are more workers
    #: than cores) and the trainer's threads the cores left, given back as they were at shutdown; with no core left (as
    #: many workers as cores), the trainer stays unpinned. A list places the workers by hand, one non-empty set of core
    #: ids per worker (``[{0}, {1}, {2, 3}]``), and leaves the trainer alone. Each worker pins itself at its start,
    #: before it builds its env (whose threads inherit the cores), and runs as many torch threads as it has cores, in
    #: place of ``num_threads``. Workers must run on this host (``launcher='local'``, no ``remote_workers``).
    worker_affinity: str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None


class MultiSyncOptions(WorkerOptions, total=False):
    """The options of ``MultiSyncCollector``."""

    #: how worker batches combine: ``None`` or ``"stack"`` stacks them into ``[n_workers, n_envs, T]``; ``0``
    #: concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time (``[n_envs, n_workers * T]``).
    cat_results: str | int | None


class MultiAsyncOptions(WorkerOptions, total=False):
    """The options of ``MultiAsyncCollector``."""

    #: batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory stays bounded.
    credits: int

    #: the most policy versions a batch may be behind the collector's when it is handed out: a batch with a frame chosen
    #: by an older version is dropped (counted in ``stats().stale_batches``), its memory given back, and the next one
    #: taken; its worker's stream goes on with its next batch. ``None``: no limit (``stats().policy_lag`` says how far
    #: behind each batch was).
    max_policy_lag: int | None


class AsyncOptions(TypedDict, total=False):
    """The options of ``AsyncCollector``."""

    #: frames in each batch handed out: from every worker together where a batch holds a part from each
    #: (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or worker. Rounded up
    #: to a multiple of the number of envs, so that every env steps equally often (with a warning):
    #: ``collector.frames_per_batch`` then says what each batch holds, ``collector.requested_frames_per_batch`` what was
    #: asked.
    frames_per_batch: Required[int]

    #: frames to collect in all, after which iteration ends; ``-1`` collects forever.
    total_frames: int

    #: a zero-argument callable building the policy where it runs, instead of ``policy`` (for a policy that does not
    #: pickle). Multi-process collectors also take an import path ``'module:name'``, which each worker imports.
    policy_factory: Callable[[], PolicyLike] | str | None

    #: fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the multi-process
    #: collectors take a list too, with one device per worker.
    device: Devices

    #: where env data lives; the multi-process collectors take a list too, with one device per worker.
    env_device: Devices

    #: where the policy runs (data is cast between it and the env device); the multi-process collectors take a list too,
    #: with one device per worker.
    policy_device: Devices

    #: where batches land; the multi-process collectors take a list too, with one device per worker.
    storing_device: Devices

    #: truncate (``truncated=True``) and reset trajectories longer than this; ``None``: no limit.
    max_frames_per_traj: int | None

    #: act randomly for this many frames first (``None``: 0).
    init_random_frames: int | None

    #: reset every env at the start of each batch.
    reset_at_each_iter: bool

    #: what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector with it (from a
    #: worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env from its factory (a
    #: vector env whole), where it runs (a worker process stays up), ends the episodes in flight as truncated at their
    #: last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the failed step yields no frame, and
    #: the next frames start new trajectories from a reset), counts it in ``stats().env_restarts`` and logs a warning
    #: with the exception on the ``acollect`` logger. An env that fails again after 3 rebuilds in a row with no step
    #: taken between them (its factory raises, or it raises before its first step each time) breaks the collector with
    #: its last exception. ``"restart"`` needs an env factory or a gymnasium id (not an env instance); the coroutine
    #: envs of an ``AsyncEnvPool`` are rebuilt one by one, by the pool, each ending its own episode.
    env_errors: str

    #: a callable applied to each batch before it is handed out, in this process (in the collection thread, for
    #: ``Collector``).
    postproc: Callable[[TensorDictBase], TensorDictBase] | None

    #: hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of ``[n_envs, T]``
    #: batches.
    split_trajs: bool

    #: hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the longest, with a boolean
    #: ``("collector", "mask")`` (True on real frames), in the order they ended. Workers still collect
    #: ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames collected; when they are
    #: reached, the episodes in progress are handed out cut, truncated at their last frame (the last batch may hold
    #: fewer than N). ``None``: ``[n_envs, T]`` batches.
    trajs_per_batch: int | None

    #: tensordict interaction type used while collecting (an ``InteractionType`` or its name, such as ``"mode"``); set
    #: per collection thread and per worker, so collectors never change each other's.
    exploration_type: InteractionType | str | None

    #: keyword arguments of the env factory, or of the env a gymnasium id names (such as ``{"num_envs": 8}``).
    env_kwargs: Mapping[str, Any] | None

    #: show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm bar if tqdm is installed,
    #: else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``, ``"log"`` or ``False`` (nothing
    #: shown). Workers count their episodes and send them with each batch.
    progress: bool | str

    #: options per worker: one dict for every worker, or a list of dicts with one per worker, among ``device``,
    #: ``env_device``, ``env_errors``, ``env_kwargs``, ``exploration_type``, ``init_random_frames``,
    #: ``max_frames_per_traj``, ``num_threads``, ``policy_device``, ``reset_at_each_iter``, ``storing_device``.
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: push the weights of ``policy`` (this process's copy) after every batch.
    update_after_each_batch: bool

    #: push the weights of ``policy`` at least every this many batches (``None``: when asked only).
    max_weight_update_interval: int | None

    #: how each model's weights travel: model id -> ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()``
    #: (default: through shared memory to workers on this host, else over the endpoint).
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None

    #: restarts allowed per worker; ``0`` raises on the first crash.
    max_worker_restarts: int

    #: seconds a collecting worker may make no env step (or any worker send no heartbeat) before it counts as hung; a
    #: worker with no parent process to watch (started by hand, or on another host) exits after as long without a word
    #: from its collector.
    heartbeat_timeout: float

    #: seconds a worker may take to start and build its env and policy (or to join, for one started by hand).
    startup_timeout: float

    #: seconds :meth:`async_shutdown` takes at most, unless it is given a timeout.
    shutdown_timeout: float

    #: ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which workers connect to (``None``:
    #: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's address>:<free port>``).
    address: str | None

    #: how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
    start_method: str

    #: where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each), ``"submitit"`` (one
    #: submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)`` (see
    #: ``acollect.launchers``); checked together with ``start_method``.
    launcher: Any

    #: torch threads in each worker.
    num_threads: int

    #: move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or more on a local address).
    use_shared_memory: bool | None

    #: how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys DIR``, on any machine)
    #: instead of by the collector: the last ones. The collector waits up to ``startup_timeout`` for them to join. Needs
    #: ``address`` and ``keys``.
    remote_workers: int

    #: a key directory written by ``acollect keys`` (or a ``ServerKeys``): the endpoint then encrypts every connection
    #: with CURVE and accepts only the workers whose public key is in its ``authorized/`` directory; others are refused
    #: and counted in ``rejected_peers``.
    keys: ServerKeys | str | os.PathLike[str] | None

    #: ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and never written while any
    #: tensor of it is held (a view, a slice, a numpy array of one), then given back to its worker (see
    #: ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once.
    copy_batches: bool

    #: the most shared memory lent to the caller at once, in bytes: beyond it a batch is handed out as a copy (its
    #: memory given back at once), so a caller keeping every batch never stalls collection. ``None``: 1 GiB, or a
    #: quarter of ``/dev/shm`` where that is less.
    max_lent_bytes: int | None

    #: ignore Python warnings inside the workers (an env's deprecation warnings, repeated by every worker, would drown
    #: the trainer's output); ``False`` lets them through to the workers' stderr.
    filter_worker_warnings: bool

    #: the cores each worker process runs on (Linux; refused where ``os.sched_setaffinity`` is missing, such as macOS).
    #: ``None`` (default): nothing is pinned, the OS places every process. ``"auto"``: worker ``i`` gets the ``i``-th
    #: core this process may use (``os.sched_getaffinity(0)`` at construction, round-robin when there are more workers
    #: than cores) and the trainer's threads the cores left, given back as they were at shutdown; with no core left (as
    #: many workers as cores), the trainer stays unpinned. A list places the workers by hand, one non-empty set of core
    #: ids per worker (``[{0}, {1}, {2, 3}]``), and leaves the trainer alone. Each worker pins itself at its start,
    #: before it builds its env (whose threads inherit the cores), and runs as many torch threads as it has cores, in
    #: place of ``num_threads``. Workers must run on this host (``launcher='local'``, no ``remote_workers``).
    worker_affinity: str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None

    #: batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory stays bounded.
    credits: int

    #: the most policy versions a batch may be behind the collector's when it is handed out: a batch with a frame chosen
    #: by an older version is dropped (counted in ``stats().stale_batches``), its memory given back, and the next one
    #: taken; its worker's stream goes on with its next batch. ``None``: no limit (``stats().policy_lag`` says how far
    #: behind each batch was).
    max_policy_lag: int | None


class BatchedOptions(MultiAsyncOptions, total=False):
    """The options of ``AsyncBatchedCollector``."""

    #: the most observations in one forward pass (``None``: every env of every worker).
    max_batch_size: int | None

    #: seconds a waiting observation may wait for others to join its forward pass; a pass runs at once when every worker
    #: is waiting.
    max_wait: float

    #: each worker builds its envs as this many groups (from the env factory, with ``num_envs`` shared out among them)
    #: and steps one group while the others wait for their actions, hiding the round trip to the server: a worker never
    #: idles while a pass runs, and a pass takes the requests of every group that waits. ``1`` steps every env together
    #: (a worker waits for each pass). ``None`` picks what measured best (``docs/central-inference.md``): 4 with a
    #: policy on a GPU (a pass frees the CPU: the workers step while it runs); on a CPU, 2 where a core is left for the
    #: server beside the workers, else 1 (the server's pass needs the core the groups would step on), and one group
    #: where groups do not apply. A count given by name where they cannot apply (``env_kwargs`` without ``num_envs`` of
    #: at least that many, coroutine envs, ``init_random_frames``) is refused with the reason. Batches keep their
    #: layout.
    env_groups: int | None

    #: forward passes the server may run at once, each in a thread of its own (with its own CUDA stream and page-locked
    #: buffers on a GPU): requests gather into the next pass while one runs, and no worker waits for every other pass to
    #: end. ``None``: 2 on a GPU, 1 on a CPU (where passes at once only share the same cores; one pass at a time on a
    #: CPU runs in the server's loop thread, saving two thread hand-offs a pass).
    passes_in_flight: int | None

    #: torch threads of the server process (its copies and, on CPU, its forward passes); ``None``: the cores this
    #: process may use beyond one per worker, at least 1. More threads than free cores make every pass wait for
    #: descheduled threads.
    server_threads: int | None

    #: where the inference server's loop runs: ``"process"``, a process of its own, owned like a worker (its crash or
    #: hang breaks the collector within about a second, with its exit code or traceback), so that no step waits for the
    #: trainer's GIL; ``"thread"``, a thread of this process: no process to start, but every pass shares the trainer's
    #: GIL (the trainer's Python code and the workers' steps wait for each other).
    server: str


class ModeOptions(MultiSyncOptions, MultiAsyncOptions, total=False):
    """The options of a collector that takes its mode (``sync``) as an argument."""

    #: ``True``: lockstep batches, one part from every worker, all collected with the same weights, stacked or
    #: concatenated (as from ``MultiSyncCollector``); ``False``: each worker's batch, first ready, first served, tagged
    #: with its ``("collector", "worker_id")`` (as from ``MultiAsyncCollector``).
    sync: bool


class DistributedOptions(TypedDict, total=False):
    """The options of ``DistributedCollector``."""

    #: frames in each batch handed out: from every worker together where a batch holds a part from each
    #: (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or worker. Rounded up
    #: to a multiple of the number of envs, so that every env steps equally often (with a warning):
    #: ``collector.frames_per_batch`` then says what each batch holds, ``collector.requested_frames_per_batch`` what was
    #: asked.
    frames_per_batch: Required[int]

    #: frames to collect in all, after which iteration ends; ``-1`` collects forever.
    total_frames: int

    #: a zero-argument callable building the policy where it runs, instead of ``policy`` (for a policy that does not
    #: pickle). Multi-process collectors also take an import path ``'module:name'``, which each worker imports.
    policy_factory: Callable[[], PolicyLike] | str | None

    #: fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the multi-process
    #: collectors take a list too, with one device per worker.
    device: Devices

    #: where env data lives; the multi-process collectors take a list too, with one device per worker.
    env_device: Devices

    #: where the policy runs (data is cast between it and the env device); the multi-process collectors take a list too,
    #: with one device per worker.
    policy_device: Devices

    #: where batches land; the multi-process collectors take a list too, with one device per worker.
    storing_device: Devices

    #: truncate (``truncated=True``) and reset trajectories longer than this; ``None``: no limit.
    max_frames_per_traj: int | None

    #: act randomly for this many frames first (``None``: 0).
    init_random_frames: int | None

    #: reset every env at the start of each batch.
    reset_at_each_iter: bool

    #: what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector with it (from a
    #: worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env from its factory (a
    #: vector env whole), where it runs (a worker process stays up), ends the episodes in flight as truncated at their
    #: last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the failed step yields no frame, and
    #: the next frames start new trajectories from a reset), counts it in ``stats().env_restarts`` and logs a warning
    #: with the exception on the ``acollect`` logger. An env that fails again after 3 rebuilds in a row with no step
    #: taken between them (its factory raises, or it raises before its first step each time) breaks the collector with
    #: its last exception. ``"restart"`` needs an env factory or a gymnasium id (not an env instance); the coroutine
    #: envs of an ``AsyncEnvPool`` are rebuilt one by one, by the pool, each ending its own episode.
    env_errors: str

    #: a callable applied to each batch before it is handed out, in this process (in the collection thread, for
    #: ``Collector``).
    postproc: Callable[[TensorDictBase], TensorDictBase] | None

    #: hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of ``[n_envs, T]``
    #: batches.
    split_trajs: bool

    #: hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the longest, with a boolean
    #: ``("collector", "mask")`` (True on real frames), in the order they ended. Workers still collect
    #: ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames collected; when they are
    #: reached, the episodes in progress are handed out cut, truncated at their last frame (the last batch may hold
    #: fewer than N). ``None``: ``[n_envs, T]`` batches.
    trajs_per_batch: int | None

    #: tensordict interaction type used while collecting (an ``InteractionType`` or its name, such as ``"mode"``); set
    #: per collection thread and per worker, so collectors never change each other's.
    exploration_type: InteractionType | str | None

    #: keyword arguments of the env factory, or of the env a gymnasium id names (such as ``{"num_envs": 8}``).
    env_kwargs: Mapping[str, Any] | None

    #: show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm bar if tqdm is installed,
    #: else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``, ``"log"`` or ``False`` (nothing
    #: shown). Workers count their episodes and send them with each batch.
    progress: bool | str

    #: options per worker: one dict for every worker, or a list of dicts with one per worker, among ``device``,
    #: ``env_device``, ``env_errors``, ``env_kwargs``, ``exploration_type``, ``init_random_frames``,
    #: ``max_frames_per_traj``, ``num_threads``, ``policy_device``, ``reset_at_each_iter``, ``storing_device``.
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: push the weights of ``policy`` (this process's copy) after every batch.
    update_after_each_batch: bool

    #: push the weights of ``policy`` at least every this many batches (``None``: when asked only).
    max_weight_update_interval: int | None

    #: how each model's weights travel: model id -> ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()``
    #: (default: through shared memory to workers on this host, else over the endpoint).
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None

    #: restarts allowed per worker; ``0`` raises on the first crash.
    max_worker_restarts: int

    #: seconds a collecting worker may make no env step (or any worker send no heartbeat) before it counts as hung; a
    #: worker with no parent process to watch (started by hand, or on another host) exits after as long without a word
    #: from its collector.
    heartbeat_timeout: float

    #: seconds a worker may take to start and build its env and policy (or to join, for one started by hand).
    startup_timeout: float

    #: seconds :meth:`async_shutdown` takes at most, unless it is given a timeout.
    shutdown_timeout: float

    #: ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which workers connect to (``None``:
    #: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's address>:<free port>``).
    address: str | None

    #: how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
    start_method: str

    #: where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each), ``"submitit"`` (one
    #: submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)`` (see
    #: ``acollect.launchers``); checked together with ``start_method``.
    launcher: Any

    #: torch threads in each worker.
    num_threads: int

    #: move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or more on a local address).
    use_shared_memory: bool | None

    #: how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys DIR``, on any machine)
    #: instead of by the collector: the last ones. The collector waits up to ``startup_timeout`` for them to join. Needs
    #: ``address`` and ``keys``.
    remote_workers: int

    #: a key directory written by ``acollect keys`` (or a ``ServerKeys``): the endpoint then encrypts every connection
    #: with CURVE and accepts only the workers whose public key is in its ``authorized/`` directory; others are refused
    #: and counted in ``rejected_peers``.
    keys: ServerKeys | str | os.PathLike[str] | None

    #: ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and never written while any
    #: tensor of it is held (a view, a slice, a numpy array of one), then given back to its worker (see
    #: ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once.
    copy_batches: bool

    #: the most shared memory lent to the caller at once, in bytes: beyond it a batch is handed out as a copy (its
    #: memory given back at once), so a caller keeping every batch never stalls collection. ``None``: 1 GiB, or a
    #: quarter of ``/dev/shm`` where that is less.
    max_lent_bytes: int | None

    #: ignore Python warnings inside the workers (an env's deprecation warnings, repeated by every worker, would drown
    #: the trainer's output); ``False`` lets them through to the workers' stderr.
    filter_worker_warnings: bool

    #: the number of workers where ``create_env_fn_list`` is one factory (default: the CPU count).
    num_workers: int | None

    #: batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory stays bounded.
    credits: int

    #: the most policy versions a batch may be behind the collector's when it is handed out: a batch with a frame chosen
    #: by an older version is dropped (counted in ``stats().stale_batches``), its memory given back, and the next one
    #: taken; its worker's stream goes on with its next batch. ``None``: no limit (``stats().policy_lag`` says how far
    #: behind each batch was).
    max_policy_lag: int | None

    #: how worker batches combine: ``None`` or ``"stack"`` stacks them into ``[n_workers, n_envs, T]``; ``0``
    #: concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time (``[n_envs, n_workers * T]``).
    cat_results: str | int | None

    #: ``True``: lockstep batches, one part from every worker, all collected with the same weights, stacked or
    #: concatenated (as from ``MultiSyncCollector``); ``False``: each worker's batch, first ready, first served, tagged
    #: with its ``("collector", "worker_id")`` (as from ``MultiAsyncCollector``).
    sync: bool

    #: ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank) or ``"mpi"``: one this torch was built
    #: with.
    backend: str

    #: port of the rendezvous on ``master_addr`` (``None``: a free one).
    tcp_port: int | None

    #: a torch.distributed init URL instead (``"tcp://host:port"``, ``"file:///path"``), without ``tcp_port``.
    init_method: str | None

    #: the collector's address as the workers reach it, for the rendezvous.
    master_addr: str

    #: seconds any torch.distributed wait may take (rendezvous, one batch, one broadcast); torch's own default is 30
    #: minutes.
    dist_timeout: float


class DistributedSyncOptions(TypedDict, total=False):
    """The options of ``DistributedSyncCollector``."""

    #: frames in each batch handed out: from every worker together where a batch holds a part from each
    #: (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or worker. Rounded up
    #: to a multiple of the number of envs, so that every env steps equally often (with a warning):
    #: ``collector.frames_per_batch`` then says what each batch holds, ``collector.requested_frames_per_batch`` what was
    #: asked.
    frames_per_batch: Required[int]

    #: frames to collect in all, after which iteration ends; ``-1`` collects forever.
    total_frames: int

    #: a zero-argument callable building the policy where it runs, instead of ``policy`` (for a policy that does not
    #: pickle). Multi-process collectors also take an import path ``'module:name'``, which each worker imports.
    policy_factory: Callable[[], PolicyLike] | str | None

    #: fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the multi-process
    #: collectors take a list too, with one device per worker.
    device: Devices

    #: where env data lives; the multi-process collectors take a list too, with one device per worker.
    env_device: Devices

    #: where the policy runs (data is cast between it and the env device); the multi-process collectors take a list too,
    #: with one device per worker.
    policy_device: Devices

    #: where batches land; the multi-process collectors take a list too, with one device per worker.
    storing_device: Devices

    #: truncate (``truncated=True``) and reset trajectories longer than this; ``None``: no limit.
    max_frames_per_traj: int | None

    #: act randomly for this many frames first (``None``: 0).
    init_random_frames: int | None

    #: reset every env at the start of each batch.
    reset_at_each_iter: bool

    #: what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector with it (from a
    #: worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env from its factory (a
    #: vector env whole), where it runs (a worker process stays up), ends the episodes in flight as truncated at their
    #: last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the failed step yields no frame, and
    #: the next frames start new trajectories from a reset), counts it in ``stats().env_restarts`` and logs a warning
    #: with the exception on the ``acollect`` logger. An env that fails again after 3 rebuilds in a row with no step
    #: taken between them (its factory raises, or it raises before its first step each time) breaks the collector with
    #: its last exception. ``"restart"`` needs an env factory or a gymnasium id (not an env instance); the coroutine
    #: envs of an ``AsyncEnvPool`` are rebuilt one by one, by the pool, each ending its own episode.
    env_errors: str

    #: a callable applied to each batch before it is handed out, in this process (in the collection thread, for
    #: ``Collector``).
    postproc: Callable[[TensorDictBase], TensorDictBase] | None

    #: hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of ``[n_envs, T]``
    #: batches.
    split_trajs: bool

    #: hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the longest, with a boolean
    #: ``("collector", "mask")`` (True on real frames), in the order they ended. Workers still collect
    #: ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames collected; when they are
    #: reached, the episodes in progress are handed out cut, truncated at their last frame (the last batch may hold
    #: fewer than N). ``None``: ``[n_envs, T]`` batches.
    trajs_per_batch: int | None

    #: tensordict interaction type used while collecting (an ``InteractionType`` or its name, such as ``"mode"``); set
    #: per collection thread and per worker, so collectors never change each other's.
    exploration_type: InteractionType | str | None

    #: keyword arguments of the env factory, or of the env a gymnasium id names (such as ``{"num_envs": 8}``).
    env_kwargs: Mapping[str, Any] | None

    #: show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm bar if tqdm is installed,
    #: else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``, ``"log"`` or ``False`` (nothing
    #: shown). Workers count their episodes and send them with each batch.
    progress: bool | str

    #: options per worker: one dict for every worker, or a list of dicts with one per worker, among ``device``,
    #: ``env_device``, ``env_errors``, ``env_kwargs``, ``exploration_type``, ``init_random_frames``,
    #: ``max_frames_per_traj``, ``num_threads``, ``policy_device``, ``reset_at_each_iter``, ``storing_device``.
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: push the weights of ``policy`` (this process's copy) after every batch.
    update_after_each_batch: bool

    #: push the weights of ``policy`` at least every this many batches (``None``: when asked only).
    max_weight_update_interval: int | None

    #: how each model's weights travel: model id -> ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()``
    #: (default: through shared memory to workers on this host, else over the endpoint).
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None

    #: restarts allowed per worker; ``0`` raises on the first crash.
    max_worker_restarts: int

    #: seconds a collecting worker may make no env step (or any worker send no heartbeat) before it counts as hung; a
    #: worker with no parent process to watch (started by hand, or on another host) exits after as long without a word
    #: from its collector.
    heartbeat_timeout: float

    #: seconds a worker may take to start and build its env and policy (or to join, for one started by hand).
    startup_timeout: float

    #: seconds :meth:`async_shutdown` takes at most, unless it is given a timeout.
    shutdown_timeout: float

    #: ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which workers connect to (``None``:
    #: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's address>:<free port>``).
    address: str | None

    #: how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
    start_method: str

    #: where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each), ``"submitit"`` (one
    #: submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)`` (see
    #: ``acollect.launchers``); checked together with ``start_method``.
    launcher: Any

    #: torch threads in each worker.
    num_threads: int

    #: move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or more on a local address).
    use_shared_memory: bool | None

    #: how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys DIR``, on any machine)
    #: instead of by the collector: the last ones. The collector waits up to ``startup_timeout`` for them to join. Needs
    #: ``address`` and ``keys``.
    remote_workers: int

    #: a key directory written by ``acollect keys`` (or a ``ServerKeys``): the endpoint then encrypts every connection
    #: with CURVE and accepts only the workers whose public key is in its ``authorized/`` directory; others are refused
    #: and counted in ``rejected_peers``.
    keys: ServerKeys | str | os.PathLike[str] | None

    #: ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and never written while any
    #: tensor of it is held (a view, a slice, a numpy array of one), then given back to its worker (see
    #: ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once.
    copy_batches: bool

    #: the most shared memory lent to the caller at once, in bytes: beyond it a batch is handed out as a copy (its
    #: memory given back at once), so a caller keeping every batch never stalls collection. ``None``: 1 GiB, or a
    #: quarter of ``/dev/shm`` where that is less.
    max_lent_bytes: int | None

    #: ignore Python warnings inside the workers (an env's deprecation warnings, repeated by every worker, would drown
    #: the trainer's output); ``False`` lets them through to the workers' stderr.
    filter_worker_warnings: bool

    #: the number of workers where ``create_env_fn_list`` is one factory (default: the CPU count).
    num_workers: int | None

    #: the most policy versions a batch may be behind the collector's when it is handed out: a batch with a frame chosen
    #: by an older version is dropped (counted in ``stats().stale_batches``), its memory given back, and the next one
    #: taken; its worker's stream goes on with its next batch. ``None``: no limit (``stats().policy_lag`` says how far
    #: behind each batch was).
    max_policy_lag: int | None

    #: how worker batches combine: ``None`` or ``"stack"`` stacks them into ``[n_workers, n_envs, T]``; ``0``
    #: concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time (``[n_envs, n_workers * T]``).
    cat_results: str | int | None

    #: ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank) or ``"mpi"``: one this torch was built
    #: with.
    backend: str

    #: port of the rendezvous on ``master_addr`` (``None``: a free one).
    tcp_port: int | None

    #: a torch.distributed init URL instead (``"tcp://host:port"``, ``"file:///path"``), without ``tcp_port``.
    init_method: str | None

    #: the collector's address as the workers reach it, for the rendezvous.
    master_addr: str

    #: seconds any torch.distributed wait may take (rendezvous, one batch, one broadcast); torch's own default is 30
    #: minutes.
    dist_timeout: float


class RayOptions(TypedDict, total=False):
    """The options of ``RayCollector``."""

    #: frames in each batch handed out: from every worker together where a batch holds a part from each
    #: (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or worker. Rounded up
    #: to a multiple of the number of envs, so that every env steps equally often (with a warning):
    #: ``collector.frames_per_batch`` then says what each batch holds, ``collector.requested_frames_per_batch`` what was
    #: asked.
    frames_per_batch: Required[int]

    #: frames to collect in all, after which iteration ends; ``-1`` collects forever.
    total_frames: int

    #: a zero-argument callable building the policy where it runs, instead of ``policy`` (for a policy that does not
    #: pickle). Multi-process collectors also take an import path ``'module:name'``, which each worker imports.
    policy_factory: Callable[[], PolicyLike] | str | None

    #: fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the multi-process
    #: collectors take a list too, with one device per worker.
    device: Devices

    #: where env data lives; the multi-process collectors take a list too, with one device per worker.
    env_device: Devices

    #: where the policy runs (data is cast between it and the env device); the multi-process collectors take a list too,
    #: with one device per worker.
    policy_device: Devices

    #: where batches land; the multi-process collectors take a list too, with one device per worker.
    storing_device: Devices

    #: truncate (``truncated=True``) and reset trajectories longer than this; ``None``: no limit.
    max_frames_per_traj: int | None

    #: act randomly for this many frames first (``None``: 0).
    init_random_frames: int | None

    #: reset every env at the start of each batch.
    reset_at_each_iter: bool

    #: what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector with it (from a
    #: worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env from its factory (a
    #: vector env whole), where it runs (a worker process stays up), ends the episodes in flight as truncated at their
    #: last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the failed step yields no frame, and
    #: the next frames start new trajectories from a reset), counts it in ``stats().env_restarts`` and logs a warning
    #: with the exception on the ``acollect`` logger. An env that fails again after 3 rebuilds in a row with no step
    #: taken between them (its factory raises, or it raises before its first step each time) breaks the collector with
    #: its last exception. ``"restart"`` needs an env factory or a gymnasium id (not an env instance); the coroutine
    #: envs of an ``AsyncEnvPool`` are rebuilt one by one, by the pool, each ending its own episode.
    env_errors: str

    #: a callable applied to each batch before it is handed out, in this process (in the collection thread, for
    #: ``Collector``).
    postproc: Callable[[TensorDictBase], TensorDictBase] | None

    #: hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of ``[n_envs, T]``
    #: batches.
    split_trajs: bool

    #: hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the longest, with a boolean
    #: ``("collector", "mask")`` (True on real frames), in the order they ended. Workers still collect
    #: ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames collected; when they are
    #: reached, the episodes in progress are handed out cut, truncated at their last frame (the last batch may hold
    #: fewer than N). ``None``: ``[n_envs, T]`` batches.
    trajs_per_batch: int | None

    #: tensordict interaction type used while collecting (an ``InteractionType`` or its name, such as ``"mode"``); set
    #: per collection thread and per worker, so collectors never change each other's.
    exploration_type: InteractionType | str | None

    #: keyword arguments of the env factory, or of the env a gymnasium id names (such as ``{"num_envs": 8}``).
    env_kwargs: Mapping[str, Any] | None

    #: show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm bar if tqdm is installed,
    #: else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``, ``"log"`` or ``False`` (nothing
    #: shown). Workers count their episodes and send them with each batch.
    progress: bool | str

    #: options per worker: one dict for every worker, or a list of dicts with one per worker, among ``device``,
    #: ``env_device``, ``env_errors``, ``env_kwargs``, ``exploration_type``, ``init_random_frames``,
    #: ``max_frames_per_traj``, ``num_threads``, ``policy_device``, ``reset_at_each_iter``, ``storing_device``.
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: push the weights of ``policy`` (this process's copy) after every batch.
    update_after_each_batch: bool

    #: push the weights of ``policy`` at least every this many batches (``None``: when asked only).
    max_weight_update_interval: int | None

    #: how each model's weights travel: model id -> ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()``
    #: (default: through shared memory to workers on this host, else over the endpoint).
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None

    #: restarts allowed per worker; ``0`` raises on the first crash.
    max_worker_restarts: int

    #: what a worker lost for good does to the collector (one that dies with its ``max_worker_restarts`` spent, or a
    #: worker started by hand that leaves and is not replaced): ``"raise"`` breaks the collector with the worker's
    #: error; ``"continue"`` drops the worker (a warning on the ``"acollect"`` logger, ``stats().lost_workers``, its
    #: state ``LOST``) and collects on with the others, a lockstep batch then holding the live workers' parts only; the
    #: collector breaks when no worker is left. It applies once every worker started.
    on_worker_loss: str

    #: seconds a collecting worker may make no env step (or any worker send no heartbeat) before it counts as hung; a
    #: worker with no parent process to watch (started by hand, or on another host) exits after as long without a word
    #: from its collector.
    heartbeat_timeout: float

    #: seconds a worker may take to start and build its env and policy (or to join, for one started by hand).
    startup_timeout: float

    #: seconds :meth:`async_shutdown` takes at most, unless it is given a timeout.
    shutdown_timeout: float

    #: ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which workers connect to (``None``:
    #: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's address>:<free port>``).
    address: str | None

    #: how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
    start_method: str

    #: torch threads in each worker.
    num_threads: int

    #: move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or more on a local address).
    use_shared_memory: bool | None

    #: how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys DIR``, on any machine)
    #: instead of by the collector: the last ones. The collector waits up to ``startup_timeout`` for them to join. Needs
    #: ``address`` and ``keys``.
    remote_workers: int

    #: a key directory written by ``acollect keys`` (or a ``ServerKeys``): the endpoint then encrypts every connection
    #: with CURVE and accepts only the workers whose public key is in its ``authorized/`` directory; others are refused
    #: and counted in ``rejected_peers``.
    keys: ServerKeys | str | os.PathLike[str] | None

    #: ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and never written while any
    #: tensor of it is held (a view, a slice, a numpy array of one), then given back to its worker (see
    #: ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once.
    copy_batches: bool

    #: the most shared memory lent to the caller at once, in bytes: beyond it a batch is handed out as a copy (its
    #: memory given back at once), so a caller keeping every batch never stalls collection. ``None``: 1 GiB, or a
    #: quarter of ``/dev/shm`` where that is less.
    max_lent_bytes: int | None

    #: ignore Python warnings inside the workers (an env's deprecation warnings, repeated by every worker, would drown
    #: the trainer's output); ``False`` lets them through to the workers' stderr.
    filter_worker_warnings: bool

    #: batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory stays bounded.
    credits: int

    #: the most policy versions a batch may be behind the collector's when it is handed out: a batch with a frame chosen
    #: by an older version is dropped (counted in ``stats().stale_batches``), its memory given back, and the next one
    #: taken; its worker's stream goes on with its next batch. ``None``: no limit (``stats().policy_lag`` says how far
    #: behind each batch was).
    max_policy_lag: int | None

    #: how worker batches combine: ``None`` or ``"stack"`` stacks them into ``[n_workers, n_envs, T]``; ``0``
    #: concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time (``[n_envs, n_workers * T]``).
    cat_results: str | int | None

    #: ``True``: lockstep batches, one part from every worker, all collected with the same weights, stacked or
    #: concatenated (as from ``MultiSyncCollector``); ``False``: each worker's batch, first ready, first served, tagged
    #: with its ``("collector", "worker_id")`` (as from ``MultiAsyncCollector``).
    sync: bool

    #: what each remote collector is: ``Collector`` (one actor), ``MultiSyncCollector`` or ``MultiAsyncCollector``
    #: (``num_workers_per_collector`` actors each), a subclass of one, or its name ``"single"``, ``"sync"`` or
    #: ``"async"`` (checked by the RayCollector, which holds those classes).
    collector_class: Any

    #: actors per remote collector, each with its own env from the same factory.
    num_workers_per_collector: int

    #: number of remote collectors (``None``: ``len(create_env_fn)``, or 1).
    num_collectors: int | None

    #: keyword arguments of ``ray.init`` (``None``: find a running cluster or start a local one); unused where Ray is
    #: initialized already.
    ray_init_config: Mapping[str, Any] | None

    #: ``ray.remote`` options (``num_cpus``, ``num_gpus``, ``memory``...): one dict for every actor, or a list with one
    #: per remote collector (``None``: ``{"num_cpus": 1}`` per actor).
    remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None

    #: :meth:`start` extends this buffer when it is called without one.
    replay_buffer: Any

    #: also ``ray.shutdown()`` when the collector shuts down (``async_shutdown()``, the end of ``async with``): for a
    #: collector that started Ray itself (``ray_init_config``). It ends every actor of this process, replay buffers' and
    #: other collectors' included, so only when nothing else uses Ray; ``shutdown()`` can ask for it too.
    shutdown_ray: bool

    #: TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that TorchRL code runs.
    trust_policy: bool | None

    #: TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that TorchRL code runs.
    use_env_creator: bool | None

    #: TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that TorchRL code runs.
    no_cuda_sync: bool | None

    #: TorchRL's; only ``None``: weights reach the actors with ``update_policy_weights_()`` (and
    #: ``weight_sync_schemes``), acknowledged by each.
    weight_updater: None

    #: TorchRL's; only ``None`` (see ``weight_updater``).
    weight_recv_schemes: None
