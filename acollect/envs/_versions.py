"""Installed versions of the env libraries acollect adapts, as tuples that compare.

The adapters refuse a few releases that are known to break (a partial reset that never returns, data
mixed up across sub-envs); they ask here which release is installed, without importing it.
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["installed_release", "release"]


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string.

    Examples:
        >>> release("0.8.4"), release("1.2.0rc1"), release("2.4.6+local")
        ((0, 8, 4), (1, 2), (2, 4, 6))
    """
    parts = []
    for part in version.split("."):
        digits = part.split("+", 1)[0]
        if not digits.isdigit():
            break
        parts.append(int(digits))
    return tuple(parts)


def installed_release(dist: str) -> tuple[int, ...] | None:
    """The release of the installed distribution ``dist`` (``"ale-py"``, ``"envpool"``), ``None`` if not installed.

    Examples:
        >>> installed_release("gymnasium") >= (1, 0)
        True
        >>> installed_release("no-such-distribution") is None
        True
    """
    try:
        return release(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None
