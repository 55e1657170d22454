"""One set of argument checks, so every argument is judged, and named in its error, the same way.

Each check returns the value it accepted (converted where that is the point, as
seconds become a ``float``) and raises :class:`~acollect.errors.ConfigurationError`
naming the argument, the value given and what was expected. ``bool`` is never
taken for an int or a number of seconds: ``True`` is an ``int`` to Python, and
never what a user meant by ``num_workers=True``.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard, TypeVar

from acollect._warnings import warn
from acollect.errors import ConfigurationError

__all__ = ["check_bool", "check_callable", "check_choice", "check_int", "check_seconds", "check_total_frames"]

T = TypeVar("T")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int | None = None, optional: bool = False) -> Any:
    """Checks an int in ``[minimum, maximum]``; with ``optional``, ``None`` passes through.

    Examples:
        >>> check_int("num_workers", 2, minimum=1)
        2
        >>> check_int("num_workers", True, minimum=1)
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: num_workers=True is invalid: expected an int >= 1.
    """
    if optional and value is None:
        return None
    if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigurationError.bad_value(name, value, f"{'None or ' if optional else ''}an int {bound}")
    return value


def check_seconds(name: str, value: object, *, allow_zero: bool = False, optional: bool = False) -> Any:
    """Checks a finite number of seconds, positive (or ``>= 0`` with ``allow_zero``); returns a ``float``.

    Examples:
        >>> check_seconds("heartbeat_timeout", 5)
        5.0
        >>> check_seconds("heartbeat_timeout", float("inf"))
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: heartbeat_timeout=inf is invalid: expected a positive, finite number...
    """
    if optional and value is None:
        return None
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not (value >= 0 if allow_zero else value > 0)
    ):
        what = "a finite number of seconds >= 0" if allow_zero else "a positive, finite number of seconds"
        raise ConfigurationError.bad_value(name, value, f"{'None or ' if optional else ''}{what}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """Checks a real ``bool`` (not a truthy string or int)."""
    if not isinstance(value, bool):
        raise ConfigurationError.bad_value(name, value, "True or False")
    return value


def check_callable(name: str, value: T | None, expected: str = "a callable", *, optional: bool = True) -> T | None:
    """Checks a callable; with ``optional`` (default) ``None`` passes through."""
    if value is None and optional:
        return None
    if not callable(value):
        raise ConfigurationError.bad_value(name, value, f"{'None or ' if optional else ''}{expected}")
    return value


def check_choice(name: str, value: T, choices: tuple[Any, ...]) -> T:
    """Checks that ``value`` is one of ``choices`` (``True`` never passes for ``1``)."""
    if isinstance(value, bool) and not any(c is value for c in choices):
        raise ConfigurationError.bad_value(name, value, f"one of {choices}")
    if value not in choices:
        raise ConfigurationError.bad_value(name, value, f"one of {choices}")
    return value


def check_total_frames(total_frames: object, frames_per_batch: int) -> int:
    """Validates ``total_frames`` (``-1`` means endless) and warns when it is not a multiple of the batch."""
    if (
        isinstance(total_frames, bool)
        or not isinstance(total_frames, int)
        or (total_frames <= 0 and total_frames != -1)
    ):
        raise ConfigurationError.bad_value("total_frames", total_frames, "a positive int, or -1 for endless collection")
    if total_frames > 0 and total_frames % frames_per_batch:
        # Attributed to the user's line, however many acollect frames lie between (see acollect._warnings).
        warn(
            f"total_frames={total_frames} is not a multiple of frames_per_batch={frames_per_batch}: the last "
            f"batch ends past it, at {math.ceil(total_frames / frames_per_batch) * frames_per_batch} frames."
        )
    return total_frames
