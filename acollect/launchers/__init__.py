"""Launchers: where a multi-process collector's workers run (``launcher=`` of every such collector).

* ``"local"`` (:class:`LocalLauncher`, the default): processes on this machine.
* ``"ray"`` (:class:`RayLauncher`): one Ray actor per worker.
* ``"submitit"`` (:class:`SubmititLauncher`): one submitit job per worker (SLURM, or local processes).

Ray and submitit are optional: ``pip install 'acollect[ray]'`` / ``'acollect[submitit]'``.
"""

from acollect.launchers._local import LocalLauncher as LocalLauncher
from acollect.launchers._ray import RayLauncher as RayLauncher
from acollect.launchers._registry import LAUNCHERS as LAUNCHERS
from acollect.launchers._registry import resolve_launcher as resolve_launcher
from acollect.launchers._submitit import SubmititLauncher as SubmititLauncher
from acollect.launchers._submitit import submitit_delayed_launcher as submitit_delayed_launcher
from acollect.launchers.base import LaunchedWorker as LaunchedWorker
from acollect.launchers.base import Launcher as Launcher

__all__ = [
    "LAUNCHERS",
    "LaunchedWorker",
    "Launcher",
    "LocalLauncher",
    "RayLauncher",
    "SubmititLauncher",
    "resolve_launcher",
    "submitit_delayed_launcher",
]
