"""From a collector's signature to its settings: the settings built from its arguments, and a keyword it does not
take named.

Each public collector names every keyword it takes in its signature (what IDEs, ``help()`` and mypy read);
:func:`settings_from` builds its settings class from them (each field checked once, in the settings'
``__post_init__``), and :func:`keyword_errors`, its ``__init__``'s decorator, turns a keyword it does not take (or
no ``frames_per_batch``) into a :class:`~acollect.errors.ConfigurationError` naming the closest one it takes, or
why it refuses it.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, ParamSpec, TypeVar

from acollect.collectors._options import RolloutSettings
from acollect.errors import ConfigurationError

__all__ = ["keyword_errors", "settings_from"]

S = TypeVar("S", bound=RolloutSettings)
P = ParamSpec("P")


def settings_from(settings: type[S], values: Mapping[str, Any], **fixed: Any) -> S:
    """``settings`` built from a constructor's arguments (its ``locals()``): each field checked once.

    Args:
        settings: the collector's settings class.
        values: the constructor's arguments by name; those that are no field of ``settings`` (``self``,
            ``create_env_fn``, ``policy``) are left out.
        fixed: fields the collector's class fixes (``sync=True``), which its signature does not take.

    Examples:
        >>> def build(frames_per_batch: int, total_frames: int = -1):
        ...     return settings_from(RolloutSettings, locals())
        >>> build(8).total_frames
        -1
    """
    names = {f.name for f in fields(settings)}
    return settings(**{name: value for name, value in values.items() if name in names}, **fixed)


def keyword_errors(
    refused: Mapping[str, str] | None = None,
) -> Callable[[Callable[P, None]], Callable[P, None]]:
    """Wraps a collector's ``__init__``: a keyword it does not take, or no ``frames_per_batch``, is a
    :class:`ConfigurationError` naming it, with the closest keyword it takes (or the reason it refuses it).

    The wrapped ``__init__`` keeps its signature (``functools.wraps``): IDEs, ``help()`` and mypy read it.

    Args:
        refused: keyword -> why this collector refuses it (another collector takes it).

    Examples:
        >>> class Demo:
        ...     @keyword_errors(refused={"num_workers": "a Demo has one worker"})
        ...     def __init__(self, *, frames_per_batch: int, credits: int = 2) -> None:
        ...         pass
        >>> Demo(frames_per_batch=8, credit=3)
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: Demo() got an unexpected keyword argument 'credit'; did you mean 'credits'?
        >>> Demo(frames_per_batch=8, num_workers=2)
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: num_workers=2 is invalid: expected no value: a Demo has one worker.
    """
    reasons = dict(refused or {})

    def decorate(init: Callable[P, None]) -> Callable[P, None]:
        signature = inspect.signature(init)
        owner = init.__qualname__.split(".")[0]
        takes = [p.name for p in signature.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

        @functools.wraps(init)
        def checked(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError:
                for name, value in kwargs.items():
                    if name in reasons:
                        raise ConfigurationError.bad_value(name, value, f"no value: {reasons[name]}") from None
                    if name not in takes:
                        close = difflib.get_close_matches(name, takes[1:], n=1)  # (not self)
                        hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(takes[1:])}"
                        raise ConfigurationError(
                            f"{owner}() got an unexpected keyword argument {name!r}{hint}"
                        ) from None
                if "frames_per_batch" in takes and "frames_per_batch" not in kwargs:
                    raise ConfigurationError(
                        f"{owner}() missing keyword argument 'frames_per_batch' (frames per batch, an int >= 1)"
                    ) from None
                raise  # another mistake (too many positional arguments): Python's message says it
            init(*args, **kwargs)

        return checked

    return decorate
