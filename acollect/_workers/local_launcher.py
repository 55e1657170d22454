"""The default launcher: worker processes on this machine.

Workers are started by :func:`acollect._workers.process.start_worker` (forks of
multiprocessing's fork server with ``forkserver``, the default, or fresh
interpreters with ``spawn``). They reach the collector over a private ipc endpoint, and large
batches and weights go through shared memory.
"""

from __future__ import annotations

from acollect._workers.launcher import Launcher
from acollect._workers.process import DEFAULT_START_METHOD, WorkerProcess, check_start_method, start_worker
from acollect._workers.protocol import WorkerConfig

__all__ = ["LocalLauncher"]


class LocalLauncher(Launcher):
    """Starts each worker as a process on this host.

    Args:
        start_method: ``"forkserver"`` (default where the platform has a fork server: not Windows) or ``"spawn"``
            (see :mod:`acollect._workers.process`).

    Raises:
        ConfigurationError: a start method that cannot start workers from this process (see
            :func:`~acollect._workers.process.check_start_method`): refused before any worker starts.

    Examples:
        >>> LocalLauncher()
        LocalLauncher(start_method='forkserver')
        >>> LocalLauncher().default_address() is None  # a private ipc path
        True
    """

    name = "local"
    same_host = True

    def __init__(self, start_method: str = DEFAULT_START_METHOD) -> None:
        check_start_method(start_method)
        self.start_method = start_method

    def check_address(self, address: str | None) -> None:
        """Any ipc or tcp address works for local workers."""

    def start(self, config: WorkerConfig) -> WorkerProcess:
        """Starts the process; :meth:`WorkerProcess.write_config` hands it the config."""
        return start_worker(config, start_method=self.start_method)

    def __repr__(self) -> str:
        return f"LocalLauncher(start_method={self.start_method!r})"
