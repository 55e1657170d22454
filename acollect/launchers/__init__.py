"""Launchers: where a multi-process collector's workers run (``launcher=`` of every such collector).

* ``"local"`` (:class:`LocalLauncher`, the default): processes on this machine.
* ``"ray"`` (:class:`RayLauncher`): one Ray actor per worker.
* ``"submitit"`` (:class:`SubmititLauncher`): one submitit job per worker (SLURM, or local processes).

Ray and submitit are optional: ``pip install 'acollect[ray]'`` / ``'acollect[submitit]'``.
"""

from acollect.launchers.base import LaunchedWorker as LaunchedWorker
from acollect.launchers.base import Launcher as Launcher
from acollect.launchers.local import LocalLauncher as LocalLauncher
from acollect.launchers.ray import RayLauncher as RayLauncher
from acollect.launchers.registry import LAUNCHERS as LAUNCHERS
from acollect.launchers.registry import resolve_launcher as resolve_launcher
from acollect.launchers.submitit import SubmititLauncher as SubmititLauncher
from acollect.launchers.submitit import submitit_delayed_launcher as submitit_delayed_launcher

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
