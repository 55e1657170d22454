"""The collectors' options, declared once: type, default, check and doc in one settings field each.

:class:`RolloutSettings` (every collector), :class:`InProcessSettings` (the in-process collector),
:class:`ProcessSettings` and :class:`WorkerSettings` (collectors with worker processes) declare each option with
:func:`~acollect.collectors._option_checks.option` (its checks live in :mod:`~acollect.collectors._option_checks`);
each multi-process collector's own options are in :mod:`acollect.collectors._collector_settings`. A collector's
constructor names every keyword in its signature (what IDEs, ``help()`` and mypy read), builds its settings from them
(:mod:`acollect.collectors._keywords`) and keeps them whole (``collector.settings``). ``tests/test_options.py``
holds each signature to its settings class; ``docs/options.md`` is rendered from the declarations.

Examples:
    >>> settings = WorkerSettings(frames_per_batch=64, heartbeat_timeout=5)
    >>> settings.heartbeat_timeout, settings.filter_worker_warnings
    (5.0, True)
    >>> WorkerSettings(frames_per_batch=64, heartbeat_timeout=-1)
    Traceback (most recent call last):
    ...
    acollect.errors.ConfigurationError: heartbeat_timeout=-1 is invalid: expected a positive, finite number of seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._affinity import check_worker_affinity
from acollect._batches.trajectories import split_trajectories
from acollect._devices import DeviceLike
from acollect._policy import PolicyLike
from acollect._rollout.env_faults import ENV_ERRORS, MAX_REBUILDS_IN_A_ROW
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.auth import ServerKeys
from acollect._validate import check_bool, check_seconds
from acollect._weights.sync import WeightSyncScheme
from acollect._workers.launcher_names import resolve_launcher
from acollect._workers.process import DEFAULT_START_METHOD, START_METHODS
from acollect._workers.protocol import HEARTBEAT_TIMEOUT
from acollect.collectors._option_checks import (
    Check,
    _address,
    _callable,
    _choice,
    _devices,
    _env_kwargs,
    _exploration,
    _handover_interval,
    _init_random_frames,
    _int,
    _keys,
    _policy_factory,
    _progress,
    _schemes,
    _total_frames,
    option,
)
from acollect.errors import ConfigurationError

__all__ = [
    "DEFAULT_START_METHOD",
    "HEARTBEAT_TIMEOUT",
    "ON_WORKER_LOSS",
    "PER_WORKER_OPTIONS",
    "Devices",
    "InProcessSettings",
    "Keys",
    "ProcessSettings",
    "RolloutSettings",
    "WorkerSettings",
    "check_option",
]

#: One device, or (multi-process collectors) a list with one per worker.
Devices = DeviceLike | Sequence[DeviceLike]
#: A key directory (written by ``acollect keys``) or the keys read from one.
Keys = ServerKeys | str | os.PathLike[str]
DEVICE_OPTIONS = ("device", "env_device", "policy_device", "storing_device")
#: The values ``on_worker_loss`` takes: break the collector, or collect on with the workers left.
ON_WORKER_LOSS = ("raise", "continue")


def _collector_kwargs(name: str, value: Any) -> Any:
    parts = [value] if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else None
    if value is not None and (parts is None or not all(isinstance(p, Mapping) for p in parts)):
        raise ConfigurationError.bad_value(name, value, "None, a dict, or a list of dicts (one per worker)")
    for i, part in enumerate(parts or ()):
        unknown = set(part) - PER_WORKER_OPTIONS
        if unknown:
            raise ConfigurationError.bad_value(name, sorted(unknown), f"options among {sorted(PER_WORKER_OPTIONS)}")
        where = name if isinstance(value, Mapping) else f"{name}[{i}]"
        for key, item in part.items():
            check_option(key, item, label=f"{where}[{key!r}]")
    return value


def check_option(name: str, value: Any, *, label: str | None = None) -> Any:
    """Checks one option's value and returns the value kept.

    Raises:
        ConfigurationError: naming the option (or ``label``, such as ``"collector_kwargs[0]['device']"``).
    """
    check = _checks().get(name)
    return check(label or name, value) if check is not None else value


# -- the declarations --------------------------------------------------------------------------
# Said of each device option: what the multi-process collectors take besides one device.
_PER_WORKER = "; the multi-process collectors take a list too, with one device per worker"


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """The options every collector takes, checked, defaults filled in (see :class:`~acollect.Collector`)."""

    frames_per_batch: int = option(
        check=_int(1),
        doc="frames in each batch handed out: from every worker together where a batch holds a part from each "
        "(``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or worker. "
        "Rounded up to a multiple of the number of envs, so that every env steps equally often (with a warning): "
        "``collector.frames_per_batch`` then says what each batch holds, ``collector.requested_frames_per_batch`` "
        "what was asked.",
    )
    total_frames: int = option(
        -1, check=_total_frames, doc="frames to collect in all, after which iteration ends; ``-1`` collects forever."
    )
    policy_factory: Callable[[], PolicyLike] | str | None = option(
        None,
        check=_policy_factory,
        doc="a zero-argument callable building the policy where it runs, instead of ``policy`` (for a policy that "
        "does not pickle). Multi-process collectors also take an import path ``'module:name'``, which each worker "
        "imports.",
    )
    device: Any = option(
        None,
        check=_devices,
        accepts="Devices | None",
        doc=f"fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given{_PER_WORKER}.",
    )
    env_device: Any = option(None, check=_devices, accepts="Devices | None", doc=f"where env data lives{_PER_WORKER}.")
    policy_device: Any = option(
        None,
        check=_devices,
        accepts="Devices | None",
        doc=f"where the policy runs (data is cast between it and the env device){_PER_WORKER}.",
    )
    storing_device: Any = option(
        None, check=_devices, accepts="Devices | None", doc=f"where batches land{_PER_WORKER}."
    )
    max_frames_per_traj: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="truncate (``truncated=True``) and reset trajectories longer than this; ``None``: no limit.",
    )
    init_random_frames: int = option(
        0,
        check=_init_random_frames,
        accepts="int | None",
        doc="act randomly for this many frames first (``None``: 0).",
    )
    reset_at_each_iter: bool = option(False, check=check_bool, doc="reset every env at the start of each batch.")
    env_errors: str = option(
        "raise",
        check=_choice(*ENV_ERRORS),
        doc='what an exception from the env\'s ``step`` or ``reset`` does: ``"raise"`` breaks the collector with it '
        '(from a worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env from its '
        "factory (a vector env whole), where it runs (a worker process stays up), ends the episodes in flight as "
        'truncated at their last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the failed '
        "step yields no frame, and the next frames start new trajectories from a reset), counts it in "
        "``stats().env_restarts`` and logs a warning with the exception on the ``acollect`` logger. An env that "
        f"fails again after {MAX_REBUILDS_IN_A_ROW} rebuilds in a row with no step taken between them (its factory "
        "raises, or it raises before its first step each time) breaks the collector with its last exception. "
        '``"restart"`` needs an env factory or a gymnasium id (not an env instance); the coroutine envs of an '
        "``AsyncEnvPool`` are rebuilt one by one, by the pool, each ending its own episode.",
    )
    postproc: Callable[[TensorDictBase], TensorDictBase] | None = option(
        None,
        check=_callable("a callable on TensorDicts"),
        doc="a callable applied to each batch before it is handed out, in this process (in the collection thread, "
        "for ``Collector``).",
    )
    split_trajs: bool = option(
        False,
        check=check_bool,
        doc='hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of '
        "``[n_envs, T]`` batches.",
    )
    trajs_per_batch: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the longest, with a "
        'boolean ``("collector", "mask")`` (True on real frames), in the order they ended. Workers still collect '
        "``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames collected; when "
        "they are reached, the episodes in progress are handed out cut, truncated at their last frame (the last "
        "batch may hold fewer than N). ``None``: ``[n_envs, T]`` batches.",
    )
    exploration_type: InteractionType | None = option(
        InteractionType.RANDOM,
        check=_exploration,
        accepts="InteractionType | str | None",
        doc="tensordict interaction type used while collecting (an ``InteractionType`` or its name, such as "
        '``"mode"``); set per collection thread and per worker, so collectors never change each other\'s.',
    )
    env_kwargs: Mapping[str, Any] = option(
        check=_env_kwargs,
        factory=dict,
        accepts="Mapping[str, Any] | None",
        doc='keyword arguments of the env factory, or of the env a gymnasium id names (such as ``{"num_envs": 8}``).',
    )
    progress: bool | str = option(
        False,
        check=_progress,
        doc="show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm bar if tqdm "
        'is installed, else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``, ``"log"`` or '
        "``False`` (nothing shown). Workers count their episodes and send them with each batch.",
    )

    def rollout_spec(self, create_env_fn: Any, policy: Any, *, frames_per_batch: int, **per_worker: Any) -> RolloutSpec:
        """What an engine is built from: these options (a worker's own ``per_worker`` ones in their place), the env
        factory, the policy and the frames asked of the engine per batch; ``per_worker`` may also set
        ``traj_id_offset`` and ``traj_id_stride``.

        Examples:
            >>> RolloutSettings(frames_per_batch=8, max_frames_per_traj=5).rollout_spec(
            ...     "CartPole-v1", None, frames_per_batch=4, init_random_frames=2
            ... ).max_frames_per_traj
            5
        """
        given = {**{name: getattr(self, name) for name in _SPEC_OPTIONS}, **per_worker}
        devices = {name: given.pop(name) for name in DEVICE_OPTIONS}
        given["env_kwargs"] = dict(given["env_kwargs"])
        return RolloutSpec(
            create_env_fn=create_env_fn,
            policy=policy,
            policy_factory=self.policy_factory,
            frames_per_batch=frames_per_batch,
            devices=devices,
            **given,
        )

    def reshaper(self) -> Callable[[TensorDictBase], TensorDictBase] | None:
        """``split_trajs`` and ``postproc`` on a batch before it is handed out (user code: run off the event loop),
        ``None`` where there is nothing to do; with ``trajs_per_batch`` neither applies here: ``postproc`` applies
        to the batches of whole episodes (:class:`~acollect.collectors._base.CollectorBase`)."""
        split, postproc = self.split_trajs, self.postproc
        if self.trajs_per_batch is not None or (postproc is None and not split):
            return None

        def reshape(batch: TensorDictBase) -> TensorDictBase:
            batch = split_trajectories(batch) if split else batch
            return postproc(batch) if postproc is not None else batch

        return reshape

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name)))
        if self.trajs_per_batch is not None and self.split_trajs:
            raise ConfigurationError.bad_value(
                "split_trajs",
                self.split_trajs,
                "False with trajs_per_batch (batches of whole episodes are padded trajectories with a mask already; "
                "split_trajs would cut them again)",
            )


#: The options a rollout spec holds as they are, under the same names (the devices besides, as one mapping).
_SPEC_OPTIONS = (
    *DEVICE_OPTIONS,
    *sorted(
        {f.name for f in fields(RolloutSpec)}
        & {f.name for f in fields(RolloutSettings)}
        - {"policy_factory", "frames_per_batch"}  # (the collector's own; a spec holds a worker's share of a batch)
    ),
)


#: Options ``collector_kwargs`` may set per worker: what its rollout spec holds, and its torch threads.
PER_WORKER_OPTIONS = frozenset({*_SPEC_OPTIONS, "num_threads"})


@dataclass(frozen=True, kw_only=True)
class InProcessSettings(RolloutSettings):
    """The options of the in-process :class:`~acollect.Collector`, checked."""

    gil_handover_interval: float | None = option(
        0.002,
        check=_handover_interval,
        accepts="float | None",
        doc="the collection thread shares the GIL with the event loop; between two env steps it offers the GIL to "
        "the loop (``GilHandover``) if this many seconds passed since its last offer, so the loop "
        "waits about this long plus one step for it each time (``0``: at every step; ``None``: never, as threads do "
        "by themselves: the loop may then wait several 5 ms switch intervals). A trainer that keeps the GIL busy "
        "on the loop gets a larger share of it, and collection a smaller one (``docs/concepts.md``, background "
        "mode).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.policy_factory, str):
            raise ConfigurationError.bad_value("policy_factory", self.policy_factory, "a zero-argument callable")
        for name in DEVICE_OPTIONS:
            value = getattr(self, name)
            if isinstance(value, list):
                raise ConfigurationError.bad_value(
                    name, value, "one device (a list, one per worker, is for the multi-process collectors)"
                )


@dataclass(frozen=True, kw_only=True)
class ProcessSettings(RolloutSettings):
    """The options of collectors whose envs run in worker processes, checked (but for ``num_workers``)."""

    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = option(
        None,
        check=_collector_kwargs,
        doc="options per worker: one dict for every worker, or a list of dicts with one per worker, among "
        + ", ".join(f"``{name}``" for name in sorted(PER_WORKER_OPTIONS))
        + ".",
    )
    update_after_each_batch: bool = option(
        False, check=check_bool, doc="push the weights of ``policy`` (this process's copy) after every batch."
    )
    max_weight_update_interval: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="push the weights of ``policy`` at least every this many batches (``None``: when asked only).",
    )
    weight_sync_schemes: Mapping[str, WeightSyncScheme] = option(
        check=_schemes,
        factory=dict,
        accepts="Mapping[str, WeightSyncScheme] | None",
        doc="how each model's weights travel: model id -> ``ZmqWeightSyncScheme()`` or "
        "``SharedMemWeightSyncScheme()`` (default: through shared memory to workers on this host, else over the "
        "endpoint).",
    )
    max_worker_restarts: int = option(
        0, check=_int(0), doc="restarts allowed per worker; ``0`` raises on the first crash."
    )
    on_worker_loss: str = option(
        "raise",
        check=_choice(*ON_WORKER_LOSS),
        doc="what a worker lost for good does to the collector (one that dies with its ``max_worker_restarts`` "
        'spent, or a worker started by hand that leaves and is not replaced): ``"raise"`` breaks the collector '
        'with the worker\'s error; ``"continue"`` drops the worker (a warning on the ``"acollect"`` logger, '
        "``stats().lost_workers``, its state ``LOST``) and collects on with the others, a lockstep batch then "
        "holding the live workers' parts only; the collector breaks when no worker is left. It applies once "
        "every worker started.",
    )
    heartbeat_timeout: float = option(
        HEARTBEAT_TIMEOUT,
        check=check_seconds,
        doc="seconds a collecting worker may make no env step (or any worker send no heartbeat) before it counts "
        "as hung; a worker with no parent process to watch (started by hand, or on another host) exits after as "
        "long without a word from its collector.",
    )
    startup_timeout: float = option(
        120.0,
        check=check_seconds,
        doc="seconds a worker may take to start and build its env and policy (or to join, for one started by hand).",
    )
    shutdown_timeout: float = option(
        5.0, check=check_seconds, doc="seconds :meth:`async_shutdown` takes at most, unless it is given a timeout."
    )
    address: str | None = option(
        None,
        check=_address,
        doc='``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector\'s endpoint, which workers connect '
        "to (``None``: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's address>:<free "
        "port>``).",
    )
    start_method: str = option(
        DEFAULT_START_METHOD,
        check=_choice(*START_METHODS),
        doc='how local worker processes start: ``"forkserver"`` (forks of a process that imported torch and the '
        "worker's code once: quick to start and small; the default where the platform has a fork server, not "
        'Windows) or ``"spawn"`` (fresh interpreters, each importing torch again).',
    )
    launcher: Any = option(
        "local",
        accepts="str | Launcher",
        doc='where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each), '
        '``"submitit"`` (one submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)`` '
        "(see ``acollect.launchers``); checked together with ``start_method``.",
    )
    num_threads: int = option(1, check=_int(1), doc="torch threads in each worker.")
    use_shared_memory: bool | None = option(
        None,
        check=_choice(None, True, False),
        doc="move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or more on a local address).",
    )
    remote_workers: int = option(
        0,
        check=_int(0),
        doc="how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys DIR``, on any "
        "machine) instead of by the collector: the last ones. The collector waits up to ``startup_timeout`` for "
        "them to join. Needs ``address`` and ``keys``.",
    )
    keys: ServerKeys | None = option(
        None,
        check=_keys,
        accepts="Keys | None",
        doc="a key directory written by ``acollect keys`` (or a ``ServerKeys``): the endpoint then encrypts every "
        "connection with CURVE and accepts only the workers whose public key is in its ``authorized/`` directory; "
        "others are refused and counted in ``rejected_peers``.",
    )
    copy_batches: bool = option(
        False,
        check=check_bool,
        doc="``False`` (default): a batch is the workers' shared memory itself, lent with no copy and never written "
        "while any tensor of it is held (a view, a slice, a numpy array of one), then given back to its worker "
        "(see ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once.",
    )
    max_lent_bytes: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="the most shared memory lent to the caller at once, in bytes: beyond it a batch is handed out as a copy "
        "(its memory given back at once), so a caller keeping every batch never stalls collection. ``None``: 1 GiB, "
        "or a quarter of ``/dev/shm`` where that is less.",
    )
    cuda_dma: bool = option(
        False,
        check=check_bool,
        doc="with a CUDA ``storing_device``: ``False`` (default) moves each batch with ``.to(device, "
        "non_blocking=True)`` on the stream current where it is handed out, which orders the consumer's kernels "
        "after the copy; ``True`` registers the workers' shared memory with CUDA (page-locked) and copies by DMA on "
        "a side stream, saving the host's copy into CUDA's staging buffer. Opt-in: not yet run on a GPU.",
    )
    filter_worker_warnings: bool = option(
        True,
        check=check_bool,
        doc="ignore Python warnings inside the workers (an env's deprecation warnings, repeated by every worker, "
        "would drown the trainer's output); ``False`` lets them through to the workers' stderr.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        launcher = resolve_launcher(self.launcher, start_method=self.start_method)
        launcher.check_address(self.address)
        object.__setattr__(self, "launcher", launcher)
        if self.remote_workers and (self.keys is None or self.address is None):
            raise ConfigurationError.bad_value(
                "remote_workers",
                self.remote_workers,
                "0 unless address='tcp://HOST:PORT' and keys=<directory from `acollect keys`> are given "
                "(workers started by hand must connect to a known address and authenticate)",
            )


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(ProcessSettings):
    """The options of the multi-process collectors, checked (see :class:`~acollect.MultiSyncCollector`)."""

    num_workers: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="the number of workers where ``create_env_fn_list`` is one factory. Default: the usable cores "
        "(``os.sched_getaffinity``) less one, at least 1, for workers on this host, so that the trainer keeps a core "
        "of its own while they collect; every usable core where the workers run elsewhere.",
    )
    worker_affinity: str | list[frozenset[int]] | None = option(
        None,
        check=check_worker_affinity,
        accepts="str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None",
        doc="the cores each worker process runs on (Linux; refused where ``os.sched_setaffinity`` is missing, such "
        'as macOS). ``None`` (default): nothing is pinned, the OS places every process. ``"auto"``: worker ``i`` '
        "gets the ``i``-th core this process may use (``os.sched_getaffinity(0)`` at construction, round-robin "
        "when there are more workers than cores) and the trainer's threads the cores left, given back as they "
        "were at shutdown; with no core left (as many workers as cores), the trainer stays unpinned. A list places "
        "the workers by hand, one non-empty set of core ids per worker (``[{0}, {1}, {2, 3}]``), and leaves the "
        "trainer alone. Each worker pins itself at its start, before it builds its env (whose threads inherit the "
        "cores), and runs as many torch threads as it has cores, in place of "
        "``num_threads``. Workers must run on this host (``launcher='local'``, no ``remote_workers``).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.worker_affinity is not None and (not self.launcher.same_host or self.remote_workers):
            launcher = f"the {self.launcher.name} launcher"
            where = f"remote_workers={self.remote_workers}" if self.remote_workers else launcher
            raise ConfigurationError.bad_value(
                "worker_affinity",
                self.worker_affinity,
                f"None with {where}: only worker processes started on this host are pinned to its cores",
            )


@cache
def _checks() -> dict[str, Check]:
    """Each option's check, read from the declarations (collector_kwargs checks per-worker options with it)."""
    declared = (*fields(WorkerSettings), *fields(InProcessSettings))
    return {f.name: f.metadata["check"] for f in declared if f.metadata.get("check") is not None}
