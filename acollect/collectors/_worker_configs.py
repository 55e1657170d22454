"""From a multi-process collector's checked settings to one :class:`~acollect._workers.protocol.WorkerConfig` per
worker.

The settings (:class:`~acollect.collectors._options.WorkerSettings`) hold one value
per option; here they become one config per worker: a device list is split, one per
worker; ``collector_kwargs`` overrides options per worker; ``worker_affinity`` gives each
worker its cores (:mod:`acollect._affinity`); and the storing device is moved to the
collector's side of the wire (see :func:`collector_storing_device`). A plan that would give several workers a
CUDA context each is warned of (:func:`cuda_contexts_warning`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from acollect._affinity import AffinityPlan, plan_affinity, usable_cores
from acollect._batches.plan import BatchPlan
from acollect._devices import check_device, module_device
from acollect._policy import PolicyLike
from acollect._rollout.env_faults import check_env_errors
from acollect._validate import check_int
from acollect._workers import protocol as P
from acollect._workers.config_codec import is_import_path
from acollect.collectors._options import DEVICE_OPTIONS, WorkerSettings, check_option
from acollect.envs._factory import check_env_arg, known_num_envs
from acollect.errors import ConfigurationError

__all__ = [
    "WorkerPlan",
    "build_worker_configs",
    "check_env_args",
    "collector_storing_device",
    "configured_num_envs",
    "cuda_contexts_warning",
    "default_num_workers",
    "env_fns",
    "plan_workers",
]


def default_num_workers(*, beside_trainer: bool = True) -> int:
    """The workers a collector starts where ``num_workers`` is not given: one per usable core, but one.

    Usable cores are those this process may run on (``os.sched_getaffinity``: a container's or ``taskset``'s
    limit, not the machine's count). Workers on this host (``beside_trainer``) leave the trainer a core of its own,
    since they collect while it trains (background mode, collect-ahead, run-ahead): beside every core taken, a
    trainer on 2 cores kept a fraction of the steps it kept beside one worker (docs/background.md). Workers
    elsewhere (another host's launcher, workers started by hand) take every core this host counts.

    Examples:
        >>> from acollect._affinity import usable_cores
        >>> default_num_workers() == max(1, len(usable_cores()) - 1)
        True
        >>> default_num_workers(beside_trainer=False) == len(usable_cores())
        True
    """
    cores = len(usable_cores())
    return max(1, cores - 1) if beside_trainer else cores


def env_fns(create_env_fn_list: Any, num_workers: int | None, *, beside_trainer: bool = True) -> list[Any]:
    """One env factory per worker: the list given, or one factory repeated ``num_workers`` times (default:
    :func:`default_num_workers`)."""
    if isinstance(create_env_fn_list, (list, tuple)):
        fns = list(create_env_fn_list)
        if not fns:
            raise ConfigurationError.bad_value("create_env_fn_list", fns, "a non-empty list of env factories")
        if num_workers is not None and num_workers != len(fns):
            raise ConfigurationError.bad_value(
                "num_workers", num_workers, f"None or len(create_env_fn_list) = {len(fns)}"
            )
    else:
        if create_env_fn_list is None:
            raise ConfigurationError.bad_value(
                "create_env_fn_list", None, "a list of env factories, or one env factory / gymnasium id"
            )
        fns = [create_env_fn_list] * (num_workers or default_num_workers(beside_trainer=beside_trainer))
    for i, fn in enumerate(fns):
        if fn is None:
            raise ConfigurationError.bad_value(f"create_env_fn_list[{i}]", None, "an env factory or gymnasium id")
    return fns


def collector_storing_device(settings: WorkerSettings) -> torch.device | None:
    """The one storing device the collector applies where it hands batches out (``None``: leave them).

    What crosses processes is host memory, so workers store on the CPU and need no CUDA context just to
    hold a batch; a list of devices (one per worker) is passed to the workers as it is.
    """
    store = settings.storing_device if settings.storing_device is not None else settings.device
    return None if isinstance(store, list) else check_device("storing_device", store)


def _worker_options(settings: WorkerSettings, i: int, n: int) -> dict[str, Any]:
    """Worker ``i``'s own options where they differ from the collector's: its device where a list names one per
    worker, its CPU storing device, and its ``collector_kwargs`` (checked)."""
    opts: dict[str, Any] = {name: getattr(settings, name) for name in DEVICE_OPTIONS}
    for name in DEVICE_OPTIONS:
        value = opts[name]
        if isinstance(value, list):
            if len(value) != n:
                raise ConfigurationError.bad_value(name, value, f"one device, or a list of {n} (one per worker)")
            opts[name] = value[i]
    store = collector_storing_device(settings)
    if store is not None and store.type != "cpu":
        opts["storing_device"] = "cpu"
    extra, where = settings.collector_kwargs, "collector_kwargs"
    if isinstance(extra, Sequence):
        if len(extra) != n:
            raise ConfigurationError.bad_value(where, extra, f"a dict, or a list of {n} dicts (one per worker)")
        extra, where = extra[i], f"{where}[{i}]"
    for name, value in (extra or {}).items():
        opts[name] = check_option(name, value, label=f"{where}[{name!r}]")
    for name in DEVICE_OPTIONS:
        check_device(name, opts[name])
    return opts


def build_worker_configs(
    fns: list[Any],
    policy: PolicyLike,
    settings: WorkerSettings,
    frames_per_batch: int,
    affinity: AffinityPlan | None = None,
) -> list[P.WorkerConfig]:
    """One config per worker (the last ``remote_workers`` of them started by hand), each with its cores from
    ``affinity`` (a worker pinned to ``k`` cores runs ``k`` torch threads, whatever ``num_threads`` says)."""
    n = len(fns)
    remote = check_int("remote_workers", settings.remote_workers, maximum=n)
    cores = affinity.workers if affinity is not None else (None,) * n
    configs = []
    for i, fn in enumerate(fns):
        opts = _worker_options(settings, i, n)
        num_threads = opts.pop("num_threads", settings.num_threads)
        pinned = cores[i]
        configs.append(
            P.WorkerConfig(
                index=i,
                generation=0,
                n_workers=n,
                address="",
                parent_pid=os.getpid(),
                # Trajectory ids: worker i of n takes i, i + n, i + 2n, ...
                rollout=settings.rollout_spec(
                    fn, policy, frames_per_batch=frames_per_batch, traj_id_offset=i, traj_id_stride=n, **opts
                ),
                num_threads=num_threads if pinned is None else len(pinned),
                affinity=None if pinned is None else list(pinned),
                filter_warnings=settings.filter_worker_warnings,
                heartbeat_interval=min(1.0, settings.heartbeat_timeout / 4),
                heartbeat_timeout=settings.heartbeat_timeout,
                remote=i >= n - remote,
            )
        )
    return configs


def check_env_args(fns: list[Any], settings: WorkerSettings) -> None:
    """Raises now what the arguments already show: a gymnasium id this process's registry lacks."""
    n = len(fns)
    remote = settings.remote_workers
    for i, fn in enumerate(fns):
        # A worker on another host (started by hand, or by Ray / submitit) may register ids this process
        # never imported: only a worker started here is sure to see this process's registry. A
        # "pkg.module:make_env" string is a factory the worker imports, not a gymnasium id.
        if settings.launcher.same_host and i < n - remote and not is_import_path(fn):
            check_env_arg(fn, f"create_env_fn_list[{i}]" if n > 1 else "create_env_fn")


def configured_num_envs(fns: list[Any], settings: WorkerSettings) -> list[int | None]:
    """Each worker's number of envs where its arguments say it (a gymnasium id and its ``env_kwargs``)."""
    extra = settings.collector_kwargs
    if isinstance(extra, Sequence) and len(extra) != len(fns):
        return [None] * len(fns)  # not one per worker: building the configs says so, naming the option
    counts = []
    for i, fn in enumerate(fns):
        per_worker = extra[i] if isinstance(extra, Sequence) else extra or {}
        env_kwargs = per_worker.get("env_kwargs", settings.env_kwargs) or {}
        counts.append(None if is_import_path(fn) else known_num_envs(fn, env_kwargs))
    return counts


@dataclass(frozen=True)
class WorkerPlan:
    """What a multi-process collector's arguments say about its workers, before any of them starts."""

    fns: list[Any]  # one env factory per worker
    configs: list[P.WorkerConfig]  # one config per worker
    batch: BatchPlan  # what each batch holds: settled already where the arguments say every worker's envs
    affinity: AffinityPlan  # the cores of each worker and of the trainer (worker_affinity)


def plan_workers(
    create_env_fn_list: Any,
    policy: PolicyLike,
    settings: WorkerSettings,
    *,
    stacked: bool,
) -> WorkerPlan:
    """The one step from a collector's checked settings to its workers' configs (see docs/architecture.md).

    Args:
        create_env_fn_list: the env factories given (a list, or one factory for ``num_workers`` workers).
        policy: what the workers run (``None`` where they run none: central inference).
        settings: the collector's checked settings.
        stacked: a batch holds every worker's frames (lockstep), else one worker's.

    Raises:
        ConfigurationError: a bad env factory, gymnasium id or per-worker option, or a ``worker_affinity`` list
            whose length is not the number of workers, named.
    """
    # Workers on this host share its cores with the trainer; remote ones (some or all) do not.
    beside_trainer = settings.launcher.same_host and not settings.remote_workers
    fns = env_fns(create_env_fn_list, settings.num_workers, beside_trainer=beside_trainer)
    check_env_args(fns, settings)
    batch = BatchPlan(settings.frames_per_batch, n_workers=len(fns), stacked=stacked)
    affinity = plan_affinity(settings.worker_affinity, len(fns))
    configs = build_worker_configs(fns, policy, settings, batch.per_worker, affinity)
    for config in configs:  # an env given built cannot be rebuilt: said now, not by the worker
        assert config.rollout is not None
        check_env_errors(config.rollout.create_env_fn, config.rollout.env_errors)
    batch.settle(configured_num_envs(fns, settings))  # where the arguments say it; else once the workers said
    return WorkerPlan(fns, configs, batch, affinity)


def cuda_contexts_warning(configs: Sequence[P.WorkerConfig], policy: object) -> str | None:
    """What to tell a user whose workers would each run the policy or env on CUDA (``None``: at most one would).

    Each such worker creates a CUDA context of its own: GPU memory apiece before any weights, and passes that take
    turns on the GPU. One server batching every worker's observations (``AsyncBatchedCollector``) is the usual answer.

    Examples:
        >>> from acollect._rollout.spec import RolloutSpec
        >>> from acollect._workers.protocol import WorkerConfig
        >>> spec = RolloutSpec(create_env_fn="CartPole-v1", frames_per_batch=8, devices={"device": "cuda"})
        >>> on_gpu = [WorkerConfig(i, 0, 2, "", 0, spec) for i in range(2)]
        >>> cuda_contexts_warning(on_gpu, None).split(":")[0]
        '2 workers would each run on CUDA (cuda)'
        >>> cuda_contexts_warning(on_gpu[:1], None) is None
        True
    """
    params = module_device(policy)
    found: set[str] = set()
    n = 0
    for config in configs:
        devices = config.rollout.devices if config.rollout is not None else {}
        wanted = [devices.get(name) or devices.get("device") for name in ("policy_device", "env_device")]
        if wanted[0] is None and params is not None:
            wanted[0] = params  # a worker's policy runs where its parameters are, unless told otherwise
        cuda = {str(device) for device in wanted if device is not None and torch.device(device).type == "cuda"}
        if cuda:
            n += 1
            found |= cuda
    if n < 2:
        return None
    return (
        f"{n} workers would each run on CUDA ({', '.join(sorted(found))}): each creates a CUDA context of its own, "
        "several hundred MB of GPU memory apiece before the policy's weights (not yet measured on a GPU by acollect), "
        "and their forward passes take turns on the GPU. AsyncBatchedCollector runs one copy of the policy on the GPU "
        "for every worker and batches their observations into one pass; or run the workers' policy on the CPU "
        "(policy_device='cpu')."
    )
