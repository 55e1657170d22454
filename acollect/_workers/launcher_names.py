"""Launcher names: what ``launcher="local"`` (or ``"ray"``, ``"submitit"``) starts.

The one module that knows every concrete launcher, so that :mod:`acollect.launchers.base` (the
interface they implement) imports none of them.
"""

from __future__ import annotations

from acollect._workers.launcher import Launcher
from acollect._workers.local_launcher import LocalLauncher
from acollect._workers.process import DEFAULT_START_METHOD
from acollect._workers.ray_launcher import RayLauncher
from acollect._workers.submitit_launcher import SubmititLauncher
from acollect.errors import ConfigurationError

__all__ = ["LAUNCHERS", "resolve_launcher"]

#: The launcher names ``launcher=`` accepts (or pass a :class:`~acollect.launchers.base.Launcher` instance).
LAUNCHERS = ("local", "ray", "submitit")


def resolve_launcher(launcher: object, *, start_method: str = DEFAULT_START_METHOD) -> Launcher:
    """Turns a ``launcher=`` argument into a :class:`~acollect.launchers.base.Launcher`.

    Args:
        launcher: ``"local"``, ``"ray"``, ``"submitit"`` (each with default options) or a
            :class:`~acollect.launchers.base.Launcher` instance.
        start_method: the local launcher's start method.

    Raises:
        ConfigurationError: an unknown launcher.

    Examples:
        >>> resolve_launcher("local")
        LocalLauncher(start_method='forkserver')
    """
    if isinstance(launcher, Launcher):
        return launcher
    if launcher == "local":
        return LocalLauncher(start_method=start_method)
    if launcher == "ray":
        return RayLauncher()
    if launcher == "submitit":
        return SubmititLauncher()
    raise ConfigurationError.bad_value("launcher", launcher, f"one of {LAUNCHERS} or a Launcher instance")
