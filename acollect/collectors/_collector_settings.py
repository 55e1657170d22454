"""Each multi-process collector's settings: the shared options composed with the collector's own.

:mod:`acollect.collectors._options` declares the options every collector shares; here each public
multi-process collector gets one settings class, declaring with :func:`option` what only it takes.
The classes mirror what the collectors share:

* :class:`MultiSyncSettings` (``cat_results``) and :class:`MultiAsyncSettings` (``credits``): how batches are
  taken from the workers (:mod:`acollect.collectors._dispatch`);
* :class:`BatchedSettings`: the inference server's options;
* :class:`ModeSettings`: both modes' options and ``sync`` to pick one (each mode's option is refused in the
  other mode); :class:`DistributedSettings` and :class:`RaySettings` on top.

A keyword a collector refuses is simply not in its signature (:func:`~acollect.collectors._keywords.keyword_errors`
says why); a field its class fixes (``sync`` of ``DistributedSyncCollector``) is given by the class.

Examples:
    >>> ModeSettings(frames_per_batch=8, sync=True, cat_results=0).cat_results
    0
    >>> ModeSettings(frames_per_batch=8, sync=True, credits=3)
    Traceback (most recent call last):
    ...
    acollect.errors.ConfigurationError: credits=3 is invalid: expected no value with sync=True.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

from acollect._runtime.torch_dist import check_backend
from acollect._validate import check_bool, check_seconds
from acollect._workers.ray_launcher import check_ray_init_config, check_remote_configs
from acollect.collectors._option_checks import _choice, _int, option
from acollect.collectors._options import WorkerSettings
from acollect.errors import ConfigurationError
from acollect.inference._server import MODES

__all__ = [
    "CAT_RESULTS",
    "CREDITS",
    "BatchedSettings",
    "DistributedSettings",
    "ModeSettings",
    "MultiAsyncSettings",
    "MultiSyncSettings",
    "RaySettings",
]

#: The values ``cat_results`` takes.
CAT_RESULTS = (None, "stack", 0, -1)
#: Batches each worker may collect ahead of the trainer, by default.
CREDITS = 2


def _field(settings: type, name: str) -> Field[Any]:
    return next(f for f in fields(settings) if f.name == name)


# -- how batches are taken from the workers ----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MultiSyncSettings(WorkerSettings):
    """The options of :class:`~acollect.MultiSyncCollector`: lockstep batches, one part from every worker."""

    cat_results: str | int | None = option(
        None,
        check=_choice(*CAT_RESULTS),
        doc='how worker batches combine: ``None`` or ``"stack"`` stacks them into ``[n_workers, n_envs, T]``; '
        "``0`` concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time (``[n_envs, "
        "n_workers * T]``).",
    )


@dataclass(frozen=True, kw_only=True)
class MultiAsyncSettings(WorkerSettings):
    """The options of :class:`~acollect.MultiAsyncCollector`: each worker's batch, first ready, first served."""

    credits: int = option(
        CREDITS,
        check=_int(1),
        doc="batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory stays "
        "bounded.",
    )
    max_policy_lag: int | None = option(
        None,
        check=_int(0, optional=True),
        doc="the most policy versions a batch may be behind the collector's when it is handed out: a batch with a "
        "frame chosen by an older version is dropped (counted in ``stats().stale_batches``), its memory given "
        "back, and the next one taken; its worker's stream goes on with its next batch. ``None``: no limit "
        "(``stats().policy_lag`` says how far behind each batch was).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_policy_lag is not None and self.trajs_per_batch is not None:
            raise ConfigurationError.bad_value(
                "max_policy_lag",
                self.max_policy_lag,
                "None with trajs_per_batch: a stale batch dropped would cut a hole in the middle of the episodes it "
                "holds a part of, and only whole episodes are handed out",
            )


# -- central inference ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class BatchedSettings(MultiAsyncSettings):
    """The options of :class:`~acollect.AsyncBatchedCollector`: its workers' and its inference server's."""

    max_batch_size: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="the most observations in one forward pass (``None``: every env of every worker).",
    )
    max_wait: float = option(
        0.002,
        check=lambda name, value: check_seconds(name, value, allow_zero=True),
        doc="seconds a waiting observation may wait for others to join its forward pass; a pass runs at once when "
        "every worker is waiting.",
    )
    env_groups: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="each worker builds its envs as this many groups (from the env factory, with ``num_envs`` shared out "
        "among them) and steps one group while the others wait for their actions, hiding the round trip to the "
        "server: a worker never idles while a pass runs, and a pass takes the requests of every group that waits. "
        "``1`` steps every env together (a worker waits for each pass). ``None`` picks what measured best "
        "(``docs/central-inference.md``): 4 with a policy on a GPU (a pass frees the CPU: the workers step while "
        "it runs); on a CPU, 2 where a core is left for the server beside the workers, else 1 (the server's pass "
        "needs the core the groups would step on), and one group where groups do not apply. A count given by name "
        "where they cannot apply (``env_kwargs`` without ``num_envs`` of at least that many, coroutine envs, "
        "``init_random_frames``) is refused with the reason. Batches keep their layout.",
    )
    passes_in_flight: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="forward passes the server may run at once, each in a thread of its own (with its own CUDA stream and "
        "page-locked buffers on a GPU): requests gather into the next pass while one runs, and no worker waits "
        "for every other pass to end. ``None``: 4 on a GPU (one per env group of a worker, so that a group's pass "
        "never queues behind another's), 1 on a CPU (where passes at once only share the same "
        "cores; one pass at a time on a CPU runs in the server's loop thread, saving two thread hand-offs a pass).",
    )
    server_threads: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="torch threads of the server process (its copies and, on CPU, its forward passes); ``None``: the cores "
        "this process may use beyond one per worker, at least 1. More threads than free cores make every pass "
        "wait for descheduled threads.",
    )
    server: str = option(
        "process",
        check=_choice(*MODES),
        doc='where the inference server\'s loop runs: ``"process"``, a process of its own, owned like a worker (its '
        "crash or hang breaks the collector within about a second, with its exit code or traceback), so that no "
        'step waits for the trainer\'s GIL; ``"thread"``, a thread of this process: no process to start, but '
        "every pass shares the trainer's GIL (the trainer's Python code and the workers' steps wait for each "
        "other).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device is not None and self.policy_device is not None:
            raise ConfigurationError.bad_value(
                "policy_device", self.policy_device, "None when device is given (both name the inference device)"
            )
        if isinstance(self.inference_device, list):
            raise ConfigurationError.bad_value("device", self.inference_device, "one device: the inference server's")
        if isinstance(self.policy_factory, str):
            raise ConfigurationError.bad_value("policy_factory", self.policy_factory, "a callable")

    @property
    def inference_device(self) -> Any:
        """The device the inference server runs the policy on: ``device`` or ``policy_device`` (``None``: where
        its parameters are)."""
        return self.policy_device if self.policy_device is not None else self.device


# -- a collector with a mode --------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ModeSettings(MultiSyncSettings, MultiAsyncSettings):
    """The options of a collector that takes its mode as an argument: ``sync``, and the options of both modes
    (each refused in the other mode; ``credits=None`` is 2 with ``sync=False``)."""

    sync: bool = option(
        False,
        check=check_bool,
        doc="``True``: lockstep batches, one part from every worker, all collected with the same weights, stacked "
        "or concatenated (as from ``MultiSyncCollector``); ``False``: each worker's batch, first ready, first "
        'served, tagged with its ``("collector", "worker_id")`` (as from ``MultiAsyncCollector``).',
    )

    # Both modes' options in one signature: credits=None is "not given" (2 with sync=False, filled in below; it
    # stays None with sync=True), so that credits given with sync=True is named. Its doc is MultiAsyncSettings'
    # declaration.
    credits: int = field(
        default=None,  # type: ignore[assignment]
        metadata={**_field(MultiAsyncSettings, "credits").metadata, "check": _int(1, optional=True)},
    )

    def __post_init__(self) -> None:
        # Each mode's options are refused in the other mode (a value that would do nothing is a mistake to name).
        for name, mode in (("cat_results", True), ("credits", False), ("max_policy_lag", False)):
            value = getattr(self, name)
            if value is not None and self.sync is not mode:
                raise ConfigurationError.bad_value(name, value, f"no value with sync={self.sync!r}")
        if self.credits is None and not self.sync:
            object.__setattr__(self, "credits", _field(MultiAsyncSettings, "credits").default)
        super().__post_init__()


def _host(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError.bad_value(name, value, "a host name or address, such as '127.0.0.1'")
    return value


def _init_method(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigurationError.bad_value(
            name, value, "None (then tcp://master_addr:tcp_port), or a URL without tcp_port"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class DistributedSettings(ModeSettings):
    """The options of :class:`~acollect.DistributedCollector`: those of a collector with a mode, and where its
    torch.distributed process group forms."""

    backend: str = option(
        "gloo",
        check=lambda name, value: check_backend(value),
        doc='``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank) or ``"mpi"``: one this torch was '
        "built with.",
    )
    tcp_port: int | None = option(
        None,
        check=_int(1, 65535, optional=True),
        doc="port of the rendezvous on ``master_addr`` (``None``: a free one).",
    )
    init_method: str | None = option(
        None,
        check=_init_method,
        doc='a torch.distributed init URL instead (``"tcp://host:port"``, ``"file:///path"``), without ``tcp_port``.',
    )
    master_addr: str = option(
        "127.0.0.1", check=_host, doc="the collector's address as the workers reach it, for the rendezvous."
    )
    dist_timeout: float = option(
        60.0,
        check=check_seconds,
        doc="seconds any torch.distributed wait may take (rendezvous, one batch, one broadcast); torch's own "
        "default is 30 minutes.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init_method is not None and self.tcp_port is not None:
            raise ConfigurationError.bad_value(
                "init_method", self.init_method, "None (then tcp://master_addr:tcp_port), or a URL without tcp_port"
            )
        if self.max_worker_restarts != 0:
            raise ConfigurationError.bad_value(
                "max_worker_restarts",
                self.max_worker_restarts,
                "0: a torch.distributed process group cannot take a restarted worker in",
            )


def _none_only(name: str, value: Any) -> None:
    if value is not None:
        raise ConfigurationError.bad_value(
            name,
            value,
            "None: weights reach the actors with update_policy_weights_() (and weight_sync_schemes), acknowledged "
            "by each",
        )


def _replay_buffer(name: str, value: Any) -> Any:
    if value is not None and not callable(getattr(value, "extend", None)):
        raise ConfigurationError.bad_value(name, value, "None or an object with extend(batch)")
    return value


_TORCHRL_IGNORED = "TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that TorchRL code runs."


@dataclass(frozen=True, kw_only=True)
class RaySettings(ModeSettings):
    """The options of :class:`~acollect.RayCollector`: TorchRL's ``RayCollector`` arguments on top of those of a
    collector with a mode (its workers are Ray actors: it takes no ``launcher`` nor ``num_workers``)."""

    collector_class: Any = option(
        "single",
        doc="what each remote collector is: ``Collector`` (one actor), ``MultiSyncCollector`` or "
        "``MultiAsyncCollector`` (``num_workers_per_collector`` actors each), a subclass of one, or its name "
        '``"single"``, ``"sync"`` or ``"async"`` (checked by the RayCollector, which holds those classes).',
    )
    num_workers_per_collector: int = option(
        1,
        check=_int(1),
        doc="actors per remote collector, each with its own env from the same factory.",
    )
    num_collectors: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="number of remote collectors (``None``: ``len(create_env_fn)``, or 1).",
    )
    ray_init_config: Mapping[str, Any] | None = option(
        None,
        check=lambda name, value: check_ray_init_config(value),
        doc="keyword arguments of ``ray.init`` (``None``: find a running cluster or start a local one); unused "
        "where Ray is initialized already.",
    )
    remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = option(
        None,
        check=lambda name, value: check_remote_configs(value),
        doc="``ray.remote`` options (``num_cpus``, ``num_gpus``, ``memory``...): one dict for every actor, or a list "
        'with one per remote collector (``None``: ``{"num_cpus": 1}`` per actor).',
    )
    replay_buffer: Any = option(
        None, check=_replay_buffer, doc=":meth:`start` extends this buffer when it is called without one."
    )
    shutdown_ray: bool = option(
        False,
        check=check_bool,
        doc="also ``ray.shutdown()`` when the collector shuts down (``async_shutdown()``, the end of ``async "
        "with``): for a collector that started Ray itself (``ray_init_config``). It ends every actor of this "
        "process, replay buffers' and other collectors' included, so only when nothing else uses Ray; "
        "``shutdown()`` can ask for it too.",
    )
    trust_policy: bool | None = option(None, doc=_TORCHRL_IGNORED)
    use_env_creator: bool | None = option(None, doc=_TORCHRL_IGNORED)
    no_cuda_sync: bool | None = option(None, doc=_TORCHRL_IGNORED)
    weight_updater: None = option(
        None,
        check=_none_only,
        doc="TorchRL's; only ``None``: weights reach the actors with "
        "``update_policy_weights_()`` (and ``weight_sync_schemes``), acknowledged by each.",
    )
    weight_recv_schemes: None = option(None, check=_none_only, doc="TorchRL's; only ``None`` (see ``weight_updater``).")
