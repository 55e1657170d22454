"""The collectors' options, declared once: name, type, default, check and doc in one field each.

:class:`RolloutSettings` (every collector) and :class:`WorkerSettings` (collectors with worker
processes) declare each option with :func:`option`: its type (the field's annotation, or
``accepts`` where callers may pass more than is kept), its default, its check (from
:mod:`acollect._validate`) and a line of doc. Everything else is read from them:

* :func:`parse` checks a collector's ``**options`` once and returns the frozen settings, every
  default filled in; a misspelt keyword is named, with the closest one the collector takes;
* :func:`check_option` checks one value (``collector_kwargs`` per worker) with the field's check;
* the ``TypedDict`` s that type the constructors' ``**options`` for mypy
  (:mod:`acollect.collectors.option_types`) are generated from the fields by
  :mod:`acollect.collectors.option_codegen` (a test fails when the checked-in module is stale).

Constructors keep the settings (``collector.settings``) and copy no field out of them.

Examples:
    >>> from acollect.collectors.options import WorkerSettings, parse
    >>> settings = parse({"frames_per_batch": 64, "heartbeat_timeout": 5}, WorkerSettings)
    >>> settings.heartbeat_timeout, settings.filter_worker_warnings
    (5.0, True)
    >>> parse({"frames_per_batch": 64, "heartbeat_timout": 5}, WorkerSettings)
    Traceback (most recent call last):
    ...
    acollect.errors.ConfigurationError: unexpected keyword argument 'heartbeat_timout'; did you mean 'heartbeat_...?
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any, TypeVar

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._validate import check_bool, check_callable, check_choice, check_int, check_seconds
from acollect._warnings import warn
from acollect.collectors.option_types import InProcessOptions, ProcessOptions, RolloutOptions, WorkerOptions
from acollect.devices import check_device
from acollect.errors import ConfigurationError
from acollect.launchers.registry import resolve_launcher
from acollect.policy import PolicyLike, parse_exploration_type
from acollect.rollout import frames_per_batch_for
from acollect.transport.auth import ServerKeys, as_server_keys
from acollect.transport.weight_sync import WeightSyncScheme
from acollect.worker.process import START_METHODS
from acollect.worker.protocol import HEARTBEAT_TIMEOUT

__all__ = [
    "PER_WORKER_OPTIONS",
    "InProcessOptions",
    "InProcessSettings",
    "ProcessOptions",
    "ProcessSettings",
    "RolloutOptions",
    "RolloutSettings",
    "WorkerOptions",
    "WorkerSettings",
    "check_option",
    "check_policy_args",
    "option",
    "parse",
    "settle_frames_per_batch",
]

#: Options ``collector_kwargs`` may set per worker.
PER_WORKER_OPTIONS = frozenset({
    "device", "env_device", "policy_device", "storing_device", "max_frames_per_traj", "init_random_frames",
    "reset_at_each_iter", "exploration_type", "env_kwargs", "num_threads",
})  # fmt: skip
DEVICE_OPTIONS = ("device", "env_device", "policy_device", "storing_device")



# -- one check per option --------------------------------------------------------------------
def _devices(name: str, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_device(f"{name}[{i}]", item)
        return list(value)
    check_device(name, value)
    return value


def _policy_factory(name: str, value: Any) -> Any:
    if value is None or callable(value) or isinstance(value, str):
        return value
    raise ConfigurationError.bad_value(name, value, "None, a zero-argument callable, or an import path 'module:name'")


def _exploration(name: str, value: Any) -> InteractionType | None:
    return parse_exploration_type(value)


def _env_kwargs(name: str, value: Any) -> dict[str, Any]:
    if value is not None and not isinstance(value, Mapping):
        raise ConfigurationError.bad_value(name, value, "None or a dict")
    return dict(value or {})


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


def _schemes(name: str, value: Any) -> dict[str, WeightSyncScheme]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError.bad_value(name, value, "a dict of model id -> scheme")
    for key, scheme in value.items():
        if not isinstance(key, str) or not isinstance(scheme, WeightSyncScheme):
            raise ConfigurationError.bad_value(
                f"{name}[{key!r}]", scheme,
                "a WeightSyncScheme (ZmqWeightSyncScheme() or SharedMemWeightSyncScheme()) under a str model id",
            )  # fmt: skip
    return dict(value)


def _address(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigurationError.bad_value(name, value, "None, 'ipc://<path>' or 'tcp://<host>:<port>'")
    return value


def _keys(name: str, value: Any) -> ServerKeys | None:
    return as_server_keys(name, value)


def _int(minimum: int, *, optional: bool = False) -> Callable[[str, Any], Any]:
    return lambda name, value: check_int(name, value, minimum=minimum, optional=optional)


def _callable(expected: str) -> Callable[[str, Any], Any]:
    return lambda name, value: check_callable(name, value, expected)


def _choice(*choices: Any) -> Callable[[str, Any], Any]:
    return lambda name, value: check_choice(name, value, choices)


def check_option(name: str, value: Any, *, label: str | None = None) -> Any:
    """Checks one option's value and returns the value kept.

    Raises:
        ConfigurationError: naming the option (or ``label``, such as ``"collector_kwargs[0]['device']"``).
    """
    check = _checks().get(name)
    return check(label or name, value) if check is not None else value


def check_policy_args(policy: object, policy_factory: object) -> None:
    """A collector takes a policy or a factory building it where it runs, not both."""
    if policy is not None and policy_factory is not None:
        raise ConfigurationError(
            "policy and policy_factory were both given: pass one (policy_factory builds the policy where it runs)."
        )


def settle_frames_per_batch(
    requested: int, shown: int, worker_frames: int, n_envs: Sequence[int], *, stacked: bool
) -> int:
    """The frames each batch holds, and a warning when it is not what ``shown`` said (the one rounding rule).

    Each worker (the in-process collector counts as one) collects ``worker_frames`` rounded up to a multiple
    of its number of envs, as TorchRL does: every env steps the same number of times. A batch is every
    worker's (``stacked``, MultiSync) or one worker's (MultiAsync, in-process). Called at construction when
    every worker's number of envs is known from the arguments, else at set-up with what the workers built.

    Args:
        requested: the ``frames_per_batch`` given.
        shown: what ``collector.frames_per_batch`` says now (the warning is given when this changes).
        worker_frames: frames asked of each worker.
        n_envs: the number of envs of each worker.
        stacked: a batch holds every worker's frames.

    Returns:
        The frames per batch (the largest worker's if workers differ and batches are one worker's).

    Examples:
        >>> settle_frames_per_batch(2048, 2048, 1024, [16, 16], stacked=True)
        2048
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     settle_frames_per_batch(100, 100, 50, [3, 3], stacked=True)
        102
        >>> print(caught[0].message)
        frames_per_batch=100 is not a multiple of the number of envs (2 workers x 3 envs): each batch holds 102 ...
    """
    sizes = [frames_per_batch_for(worker_frames, n) for n in n_envs]
    actual = sum(sizes) if stacked else max(sizes)
    if actual == shown:
        return actual
    if len(n_envs) == 1:
        envs = f"{n_envs[0]}"
    elif len(set(n_envs)) == 1:
        envs = f"{len(n_envs)} workers x {n_envs[0]} envs" if stacked else f"{n_envs[0]} per worker"
    else:
        envs = f"per worker: {list(n_envs)}"
    holds = (
        f"each batch holds {actual} frames"
        if stacked or len(set(sizes)) == 1
        else f"a batch holds one worker's {sizes} frames (collector.frames_per_batch says the largest)"
    )
    warn(
        f"frames_per_batch={requested} is not a multiple of the number of envs ({envs}): {holds}, rounded up so "
        f"that every env steps equally often; collector.frames_per_batch is now {actual}."
    )
    return actual


# -- the declarations --------------------------------------------------------------------------
Check = Callable[[str, Any], Any]


def option(
    default: Any = MISSING,
    *,
    doc: str,
    check: Check | None = None,
    accepts: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """Declares one option: a settings field with its default, its check, its doc and what callers pass.

    Args:
        default: the value kept when the option is not given (none: the option is required).
        doc: one line for the generated ``TypedDict`` and for the docs.
        check: ``check(name, value)`` returns the value kept, or raises ``ConfigurationError`` naming ``name``;
            ``None``: checked elsewhere (said in ``doc``).
        accepts: the type callers may pass, where it is wider than the field's (a key directory for keys).
        factory: builds the default (for mutable ones).
    """
    metadata = {"doc": doc, "check": check, "accepts": accepts}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    if default is MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def _init_random_frames(name: str, value: Any) -> int:
    return check_int(name, value, minimum=0, optional=True) or 0


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """The options every collector takes, checked, defaults filled in (see :class:`~acollect.Collector`)."""

    frames_per_batch: int = option(check=_int(1), doc="frames per batch (rounded up to a multiple of the envs)")
    total_frames: int = option(-1, doc="frames to collect in all, -1 endless (checked by CollectorBase)")
    policy_factory: Callable[[], PolicyLike] | str | None = option(
        None, check=_policy_factory, doc="builds the policy where it runs (instead of a policy)"
    )
    device: Any = option(None, check=_devices, accepts="Devices", doc="env, policy and storing device at once")
    env_device: Any = option(None, check=_devices, accepts="Devices", doc="where the env steps")
    policy_device: Any = option(None, check=_devices, accepts="Devices", doc="where the policy runs")
    storing_device: Any = option(None, check=_devices, accepts="Devices", doc="where batches are written")
    max_frames_per_traj: int | None = option(None, check=_int(1, optional=True), doc="truncate longer episodes")
    init_random_frames: int = option(
        0, check=_init_random_frames, accepts="int | None", doc="act randomly until this many frames"
    )
    reset_at_each_iter: bool = option(False, check=check_bool, doc="reset every env at each batch")
    postproc: Callable[[TensorDictBase], TensorDictBase] | None = option(
        None, check=_callable("a callable on TensorDicts"), doc="applied to each batch before it is handed out"
    )
    split_trajs: bool = option(False, check=check_bool, doc="split batches into padded trajectories")
    exploration_type: InteractionType | None = option(
        InteractionType.RANDOM, check=_exploration, accepts="InteractionType | str | None",
        doc="tensordict interaction type while collecting",
    )  # fmt: skip
    env_kwargs: Mapping[str, Any] = option(
        check=_env_kwargs, factory=dict, accepts="Mapping[str, Any] | None", doc="keyword arguments of the env factory"
    )
    progress: bool | str = option(False, doc='a progress bar: True, "tqdm" or "log" (checked by CollectorBase)')

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, check_option(f.name, getattr(self, f.name)))


def _handover_interval(name: str, value: Any) -> float | None:
    return check_seconds(name, value, allow_zero=True, optional=True)


@dataclass(frozen=True, kw_only=True)
class InProcessSettings(RolloutSettings):
    """The options of the in-process :class:`~acollect.Collector`, checked."""

    gil_handover_interval: float | None = option(
        0.002, check=_handover_interval, accepts="float | None",
        doc="seconds between offers of the GIL to the event loop at step boundaries (0: every step, None: never)",
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ProcessSettings(RolloutSettings):
    """The options of collectors whose envs run in worker processes, checked (but for ``num_workers``)."""

    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = option(
        None, check=_collector_kwargs, doc="options per worker: one dict for all, or a list of dicts"
    )
    update_after_each_batch: bool = option(False, check=check_bool, doc="push the policy's weights after each batch")
    max_weight_update_interval: int | None = option(
        None, check=_int(1, optional=True), doc="push the policy's weights at least every this many batches"
    )
    weight_sync_schemes: Mapping[str, WeightSyncScheme] = option(
        check=_schemes, factory=dict, accepts="Mapping[str, WeightSyncScheme] | None",
        doc="how each model's weights travel (model id -> scheme)",
    )  # fmt: skip
    max_worker_restarts: int = option(0, check=_int(0), doc="restarts allowed per worker before a failure is raised")
    heartbeat_timeout: float = option(
        HEARTBEAT_TIMEOUT, check=check_seconds, doc="seconds without progress before a worker hangs"
    )
    startup_timeout: float = option(120.0, check=check_seconds, doc="seconds a worker may take to start")
    shutdown_timeout: float = option(5.0, check=check_seconds, doc="seconds async_shutdown() takes at most")
    address: str | None = option(None, check=_address, doc="where workers connect: ipc:// or tcp:// (None: private)")
    start_method: str = option("spawn", check=_choice(*START_METHODS), doc='"spawn" or "forkserver"')
    launcher: Any = option("local", doc="where workers run: a launcher or its name (checked with start_method)")
    num_threads: int = option(1, check=_int(1), doc="torch threads per worker")
    use_shared_memory: bool | None = option(
        None, check=_choice(None, True, False), doc="batches through /dev/shm slots (None: by size and address)"
    )
    remote_workers: int = option(0, check=_int(0), doc="workers started by hand that join over tcp")
    keys: ServerKeys | None = option(
        None, check=_keys, accepts="ServerKeys | str | os.PathLike[str] | None",
        doc="CURVE keys: workers must authenticate (a key directory from `acollect keys`)",
    )  # fmt: skip
    copy_batches: bool = option(True, check=check_bool, doc="hand out copies (False: lend the shared memory)")
    filter_worker_warnings: bool = option(True, check=check_bool, doc="silence Python warnings in the workers")

    def __post_init__(self) -> None:
        super().__post_init__()
        launcher = resolve_launcher(self.launcher, start_method=self.start_method)
        launcher.check_address(self.address)
        object.__setattr__(self, "launcher", launcher)
        if self.remote_workers and (self.keys is None or self.address is None):
            raise ConfigurationError.bad_value(
                "remote_workers", self.remote_workers,
                "0 unless address='tcp://HOST:PORT' and keys=<directory from `acollect keys`> are given "
                "(workers started by hand must connect to a known address and authenticate)",
            )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(ProcessSettings):
    """The options of the multi-process collectors, checked (see :class:`~acollect.MultiSyncCollector`)."""

    num_workers: int | None = option(None, check=_int(1, optional=True), doc="worker processes (with one env factory)")


@cache
def _checks() -> dict[str, Check]:
    """Each option's check, read from the declarations (collector_kwargs checks per-worker options with it)."""
    declared = (*fields(WorkerSettings), *fields(InProcessSettings))
    return {f.name: f.metadata["check"] for f in declared if f.metadata.get("check") is not None}


S = TypeVar("S", bound=RolloutSettings)


def parse(options: Mapping[str, Any], settings: type[S], *, owner: Callable[..., Any] | None = None) -> S:
    """Checks ``options`` once and returns them as ``settings`` (a frozen dataclass, defaults filled in).

    Args:
        options: the keyword options given to a collector.
        settings: :class:`RolloutSettings` or :class:`WorkerSettings`.
        owner: the collector class (or function) they were given to: its error messages name it, and its own
            keyword arguments are among the names suggested for a misspelt one.

    Raises:
        ConfigurationError: an unknown option (named, with the closest known one), a missing
            ``frames_per_batch``, or a bad value (named).
    """
    known = [f.name for f in fields(settings)]
    who = f"{owner.__name__}() " if owner is not None else ""
    for name in options:
        if name not in known:
            takes = [*known, *_keywords_of(owner)]
            close = difflib.get_close_matches(name, takes, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(sorted(set(takes)))}"
            raise ConfigurationError(f"{who}{'got an ' if who else ''}unexpected keyword argument {name!r}{hint}")
    if "frames_per_batch" not in options:
        raise ConfigurationError(f"{who}missing keyword argument 'frames_per_batch' (frames per batch, an int >= 1)")
    return settings(**options)


def _keywords_of(owner: Callable[..., Any] | None) -> list[str]:
    if owner is None:
        return []
    function: Callable[..., Any] = owner
    if isinstance(owner, type):
        # A class's own keywords are its __init__'s (inspect.signature(cls) would show a __new__ instead).
        function = next(vars(c)["__init__"] for c in owner.__mro__ if "__init__" in vars(c))
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return []
    if isinstance(owner, type):
        params = params[1:]  # self
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

