"""How an option is declared (:func:`option`), and one check per option: each takes the option's name and the
value given, and returns the value kept or raises a :class:`~acollect.errors.ConfigurationError` naming the option,
what was given and what was expected.

The declarations (:mod:`acollect.collectors._options`, :mod:`acollect.collectors._collector_settings`) name
each option's check; a settings class runs them once, when it is built.

Examples:
    >>> _int(1)("num_threads", 0)
    Traceback (most recent call last):
    ...
    acollect.errors.ConfigurationError: num_threads=0 is invalid: expected an int >= 1.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, field
from typing import Any

import torch
from tensordict.nn import InteractionType

from acollect._devices import check_device
from acollect._policy import parse_exploration_type
from acollect._progress import check_progress
from acollect._runtime.auth import ServerKeys, as_server_keys
from acollect._validate import check_callable, check_choice, check_int, check_seconds, check_total_frames
from acollect._weights.sync import WeightSyncScheme
from acollect.errors import ConfigurationError

__all__ = ["Check", "check_policy_args", "option"]


def _devices(name: str, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_device(f"{name}[{i}]", item)
        return list(value)
    check_device(name, value)
    return value


def _policy_factory(name: str, value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, torch.nn.Module):
        # Callable, so it would pass for a factory, and fail only where it runs: `Linear.forward() missing ...`.
        kind = type(value).__name__
        raise ConfigurationError(
            f"{name}={kind}(...) (an nn.Module instance) is invalid: expected a zero-argument callable that returns "
            f"the policy, not the policy itself. Pass the instance as policy=..., or build it where it runs with "
            f"{name}=lambda: {kind}(...)."
        )
    if callable(value):
        missing = _required_parameters(value)
        if missing:
            raise ConfigurationError(
                f"{name}={getattr(value, '__qualname__', value)!r} is invalid: expected a zero-argument callable "
                f"that returns the policy, and it requires {', '.join(missing)}. Give them with "
                f"{name}=functools.partial(..., {missing[0]}=...) or a lambda, or pass an instance as policy=...."
            )
        return value
    raise ConfigurationError.bad_value(name, value, "None, a zero-argument callable, or an import path 'module:name'")


def _required_parameters(fn: Callable[..., Any]) -> list[str]:
    """The parameters a call of ``fn`` with no argument would miss (none where its signature cannot be read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or an extension type: found out when it is called
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.default is inspect.Parameter.empty and p.kind not in variadic]


def _exploration(name: str, value: Any) -> InteractionType | None:
    return parse_exploration_type(value)


def _env_kwargs(name: str, value: Any) -> dict[str, Any]:
    if value is not None and not isinstance(value, Mapping):
        raise ConfigurationError.bad_value(name, value, "None or a dict")
    return dict(value or {})


def _schemes(name: str, value: Any) -> dict[str, WeightSyncScheme]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError.bad_value(name, value, "a dict of model id -> scheme")
    for key, scheme in value.items():
        if not isinstance(key, str) or not isinstance(scheme, WeightSyncScheme):
            raise ConfigurationError.bad_value(
                f"{name}[{key!r}]",
                scheme,
                "a WeightSyncScheme (ZmqWeightSyncScheme() or SharedMemWeightSyncScheme()) under a str model id",
            )
    return dict(value)


def _address(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigurationError.bad_value(name, value, "None, 'ipc://<path>' or 'tcp://<host>:<port>'")
    return value


def _keys(name: str, value: Any) -> ServerKeys | None:
    return as_server_keys(name, value)


def _int(minimum: int, maximum: int | None = None, *, optional: bool = False) -> Callable[[str, Any], Any]:
    return lambda name, value: check_int(name, value, minimum=minimum, maximum=maximum, optional=optional)


def _callable(expected: str) -> Callable[[str, Any], Any]:
    return lambda name, value: check_callable(name, value, expected)


def _choice(*choices: Any) -> Callable[[str, Any], Any]:
    return lambda name, value: check_choice(name, value, choices)


def check_policy_args(policy: object, policy_factory: object) -> None:
    """A collector takes a policy instance or a factory building it where it runs, not both.

    Examples:
        >>> check_policy_args(torch.nn.Linear, None)
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: policy=<class '...Linear'> is invalid: expected a policy instance, not ...
    """
    if isinstance(policy, type):
        # Callable, so it would pass for a policy called on TensorDicts: `Linear.__init__() missing ...` at the first
        # step, naming neither the argument nor the mistake.
        name = policy.__name__
        factory = f"lambda: {name}(...)" if _required_parameters(policy) else name
        raise ConfigurationError.bad_value(
            "policy",
            policy,
            f"a policy instance, not a class: pass policy={name}(...), or "
            f"policy_factory={factory} to build it where it runs (policy_factory takes a zero-argument callable)",
        )
    if policy is not None and policy_factory is not None:
        raise ConfigurationError(
            "policy and policy_factory were both given: pass one (policy_factory builds the policy where it runs)."
        )


def _total_frames(name: str, value: Any) -> int:
    # Whether it is a multiple of frames_per_batch is told (a warning) once each batch's size is known.
    return check_total_frames(value, 1)


def _progress(name: str, value: Any) -> bool | str:
    check_progress(value)
    return value  # (the collector's progress display reads it again: True picks tqdm where installed)


def _init_random_frames(name: str, value: Any) -> int:
    return check_int(name, value, minimum=0, optional=True) or 0


def _handover_interval(name: str, value: Any) -> float | None:
    return check_seconds(name, value, allow_zero=True, optional=True)


# -- how an option is declared ----------------------------------------------------------------------
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
        doc: what the option does, as users read it in the options reference (``docs/options.md``, rendered
            from the declarations when the docs are built).
        check: ``check(name, value)`` returns the value kept, or raises ``ConfigurationError`` naming ``name``;
            ``None``: checked elsewhere (said in ``doc``).
        accepts: the type callers may pass, where it is wider than the field's (a key directory for keys), as
            the constructors' signatures write it.
        factory: builds the default (for mutable ones).
    """
    metadata = {"doc": doc, "check": check, "accepts": accepts}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    if default is MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)
