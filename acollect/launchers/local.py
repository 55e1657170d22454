"""The default launcher: worker processes on this machine.

Workers are started by :func:`acollect.worker.process.start_worker` (fresh
interpreters with ``spawn``, or forks of multiprocessing's fork server with
``forkserver``). They reach the collector over a private ipc endpoint, and large
batches and weights go through shared memory.
"""

from __future__ import annotations

from acollect.errors import ConfigurationError
from acollect.launchers.base import Launcher
from acollect.worker.process import START_METHODS, WorkerProcess, start_worker
from acollect.worker.protocol import WorkerConfig

__all__ = ["LocalLauncher"]


class LocalLauncher(Launcher):
    """Starts each worker as a process on this host.

    Args:
        start_method: ``"spawn"`` (default) or ``"forkserver"`` (see :mod:`acollect.worker.process`).

    Raises:
        ConfigurationError: an unknown start method.

    Examples:
        >>> LocalLauncher()
        LocalLauncher(start_method='spawn')
        >>> LocalLauncher().default_address() is None  # a private ipc path
        True
    """

    name = "local"
    same_host = True

    def __init__(self, start_method: str = "spawn") -> None:
        if start_method not in START_METHODS:
            raise ConfigurationError.bad_value("start_method", start_method, f"one of {START_METHODS}")
        self.start_method = start_method

    def check_address(self, address: str | None) -> None:
        """Any ipc or tcp address works for local workers."""

    def start(self, config: WorkerConfig) -> WorkerProcess:
        """Starts the process; :meth:`WorkerProcess.write_config` hands it the config."""
        return start_worker(config, start_method=self.start_method)

    def __repr__(self) -> str:
        return f"LocalLauncher(start_method={self.start_method!r})"
