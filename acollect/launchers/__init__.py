"""Launchers: where a multi-process collector's workers run (``launcher=`` of every such collector).

* ``"local"`` (:class:`LocalLauncher`, the default): processes on this machine.
* ``"ray"`` (:class:`RayLauncher`): one Ray actor per worker.
* ``"submitit"`` (:class:`SubmititLauncher`): one submitit job per worker (SLURM, or local processes).

Ray and submitit are optional: ``pip install 'acollect[ray]'`` / ``'acollect[submitit]'``.
"""

from acollect._workers.launcher import LaunchedWorker as LaunchedWorker
from acollect._workers.launcher import Launcher as Launcher
from acollect._workers.launcher_names import LAUNCHERS as LAUNCHERS
from acollect._workers.launcher_names import resolve_launcher as resolve_launcher
from acollect._workers.local_launcher import LocalLauncher as LocalLauncher
from acollect._workers.ray_launcher import RayLauncher as RayLauncher
from acollect._workers.submitit_launcher import SubmititLauncher as SubmititLauncher
from acollect._workers.submitit_launcher import submitit_delayed_launcher as submitit_delayed_launcher

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
