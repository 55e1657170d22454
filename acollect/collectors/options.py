"""The collectors' options: their names and types for mypy, and their values checked once.

A collector's constructor takes its options as ``**options: Unpack[WorkerOptions]``
(or :class:`RolloutOptions` for the in-process :class:`~acollect.Collector`), so
mypy checks each keyword's name and type where the collector is built. At run time
:func:`parse` turns them, once, into a frozen :class:`RolloutSettings` or
:class:`WorkerSettings` that holds every value checked (with the checks of
:mod:`acollect._validate`) and every default filled in. A misspelt keyword is
named, with the closest one the collector takes.

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
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from typing_extensions import Required, TypedDict

from acollect._validate import check_bool, check_callable, check_choice, check_int, check_seconds
from acollect._warnings import warn
from acollect.devices import DeviceLike, check_device
from acollect.errors import ConfigurationError
from acollect.launchers.registry import resolve_launcher
from acollect.policy import PolicyLike, parse_exploration_type
from acollect.rollout import frames_per_batch_for
from acollect.transport.auth import ServerKeys
from acollect.transport.weight_sync import WeightSyncScheme
from acollect.worker.process import START_METHODS

__all__ = [
    "PER_WORKER_OPTIONS",
    "ProcessOptions",
    "RolloutOptions",
    "RolloutSettings",
    "WorkerOptions",
    "WorkerSettings",
    "check_option",
    "check_policy_args",
    "parse",
    "settle_frames_per_batch",
]

#: Options ``collector_kwargs`` may set per worker.
PER_WORKER_OPTIONS = frozenset({
    "device", "env_device", "policy_device", "storing_device", "max_frames_per_traj", "init_random_frames",
    "reset_at_each_iter", "exploration_type", "env_kwargs", "num_threads",
})  # fmt: skip
DEVICE_OPTIONS = ("device", "env_device", "policy_device", "storing_device")

Devices = DeviceLike | Sequence[DeviceLike]
"""One device, or (multi-process collectors) a list with one per worker."""


class RolloutOptions(TypedDict, total=False):
    """The keyword options every collector takes (documented in each collector's Args)."""

    frames_per_batch: Required[int]
    total_frames: int
    policy_factory: Callable[[], PolicyLike] | str | None
    device: Devices
    env_device: Devices
    policy_device: Devices
    storing_device: Devices
    max_frames_per_traj: int | None
    init_random_frames: int | None
    reset_at_each_iter: bool
    postproc: Callable[[TensorDictBase], TensorDictBase] | None
    split_trajs: bool
    exploration_type: InteractionType | str | None
    env_kwargs: Mapping[str, Any] | None
    progress: bool | str


class ProcessOptions(RolloutOptions, total=False):
    """The options of collectors whose envs run in worker processes, but for ``num_workers``."""

    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None
    update_after_each_batch: bool
    max_weight_update_interval: int | None
    weight_sync_schemes: Mapping[str, WeightSyncScheme] | None
    max_worker_restarts: int
    heartbeat_timeout: float
    startup_timeout: float
    shutdown_timeout: float
    address: str | None
    start_method: str
    launcher: Any
    num_threads: int
    use_shared_memory: bool | None
    remote_workers: int
    keys: ServerKeys | str | os.PathLike[str] | None
    copy_batches: bool
    filter_worker_warnings: bool


class WorkerOptions(ProcessOptions, total=False):
    """The options of the multi-process collectors."""

    num_workers: int | None


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
    if value is None or isinstance(value, ServerKeys):
        return value
    if isinstance(value, (str, os.PathLike)):
        return ServerKeys.load(value)
    raise ConfigurationError.bad_value(name, value, "None, a key directory (`acollect keys DIR`) or a ServerKeys")


def _int(minimum: int, *, optional: bool = False) -> Callable[[str, Any], Any]:
    return lambda name, value: check_int(name, value, minimum=minimum, optional=optional)


def _callable(expected: str) -> Callable[[str, Any], Any]:
    return lambda name, value: check_callable(name, value, expected)


def _choice(*choices: Any) -> Callable[[str, Any], Any]:
    return lambda name, value: check_choice(name, value, choices)


#: The check of each option: takes the name and the value given, returns the value kept.
#: ``total_frames`` and ``progress`` are checked by :class:`~acollect.CollectorBase`, ``launcher`` with
#: ``start_method`` and ``address``.
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "frames_per_batch": _int(1),
    "policy_factory": _policy_factory,
    **dict.fromkeys(DEVICE_OPTIONS, _devices),
    "max_frames_per_traj": _int(1, optional=True),
    "init_random_frames": lambda name, value: check_int(name, value, minimum=0, optional=True) or 0,
    "reset_at_each_iter": check_bool,
    "postproc": _callable("a callable on TensorDicts"),
    "split_trajs": check_bool,
    "exploration_type": _exploration,
    "env_kwargs": _env_kwargs,
    "num_workers": _int(1, optional=True),
    "collector_kwargs": _collector_kwargs,
    "update_after_each_batch": check_bool,
    "max_weight_update_interval": _int(1, optional=True),
    "weight_sync_schemes": _schemes,
    "max_worker_restarts": _int(0),
    "heartbeat_timeout": check_seconds,
    "startup_timeout": check_seconds,
    "shutdown_timeout": check_seconds,
    "address": _address,
    "start_method": _choice(*START_METHODS),
    "num_threads": _int(1),
    "use_shared_memory": _choice(None, True, False),
    "remote_workers": _int(0),
    "keys": _keys,
    "copy_batches": check_bool,
    "filter_worker_warnings": check_bool,
}


def check_option(name: str, value: Any, *, label: str | None = None) -> Any:
    """Checks one option's value and returns the value kept.

    Raises:
        ConfigurationError: naming the option (or ``label``, such as ``"collector_kwargs[0]['device']"``).
    """
    check = _CHECKS.get(name)
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


# -- the checked values ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """The checked :class:`RolloutOptions`, defaults filled in (see :class:`~acollect.Collector`)."""

    frames_per_batch: int
    total_frames: int = -1
    policy_factory: Callable[[], PolicyLike] | str | None = None
    device: Any = None
    env_device: Any = None
    policy_device: Any = None
    storing_device: Any = None
    max_frames_per_traj: int | None = None
    init_random_frames: int = 0
    reset_at_each_iter: bool = False
    postproc: Callable[[TensorDictBase], TensorDictBase] | None = None
    split_trajs: bool = False
    exploration_type: InteractionType | None = InteractionType.RANDOM
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    progress: bool | str = False

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, check_option(f.name, getattr(self, f.name)))


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(RolloutSettings):
    """The checked :class:`WorkerOptions`, defaults filled in (see :class:`~acollect.MultiSyncCollector`)."""

    num_workers: int | None = None
    collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    update_after_each_batch: bool = False
    max_weight_update_interval: int | None = None
    weight_sync_schemes: Mapping[str, WeightSyncScheme] = field(default_factory=dict)
    max_worker_restarts: int = 0
    heartbeat_timeout: float = 30.0
    startup_timeout: float = 120.0
    shutdown_timeout: float = 5.0
    address: str | None = None
    start_method: str = "spawn"
    launcher: Any = "local"
    num_threads: int = 1
    use_shared_memory: bool | None = None
    remote_workers: int = 0
    keys: ServerKeys | None = None
    copy_batches: bool = True
    filter_worker_warnings: bool = True

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
