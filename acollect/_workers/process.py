"""Starting local worker processes, never by ``fork``.

``start_method="forkserver"`` (the default where the platform has a fork server: not Windows) forks each worker
from multiprocessing's fork server, one per program, which imported torch, tensordict, gymnasium and the worker's
code once: a worker starts in milliseconds and shares those modules' memory. The user's ``__main__`` is not run
again in it (no ``if __name__ == "__main__"`` guard is needed), and nothing in the server touches CUDA, so a
worker may use a GPU: see :mod:`acollect._workers.forkserver`. The server and multiprocessing's resource tracker
stay for the life of the program.

``start_method="spawn"`` starts a fresh interpreter with :mod:`subprocess` (``python -c <bootstrap>``) and writes
the worker's config to its stdin: each worker imports torch again (seconds of CPU, hundreds of MiB), but no helper
process is left after the collector is gone. It is what multiprocessing's spawn does, minus the re-import of the
user's ``__main__`` in every worker.

Env factories and policies go to the worker through this process-creation
channel (same host, same user), pickled with cloudpickle so that lambdas and
functions defined in ``__main__`` work. Batches and weights never are pickled.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import subprocess
import sys
from typing import Any

from acollect._runtime.spawn import bootstrap, exit_now, pickle_payload, reap_later, spawn_python
from acollect._workers import forkserver
from acollect._workers.protocol import WorkerConfig
from acollect.errors import ConfigurationError, describe_exit

__all__ = [
    "DEFAULT_START_METHOD",
    "START_METHODS",
    "WorkerProcess",
    "check_start_method",
    "describe_exit",
    "start_worker",
]

#: The accepted values of ``start_method``.
START_METHODS = ("spawn", "forkserver")

#: ``start_method``'s default: forks of the fork server where the platform has one, else fresh interpreters.
DEFAULT_START_METHOD = "forkserver" if forkserver.AVAILABLE else "spawn"

_BOOTSTRAP = bootstrap("acollect._workers.process", "_run_payload")


def _run_payload(payload: bytes) -> None:
    """The worker's entry point: ``payload`` is the cloudpickled :class:`WorkerConfig`."""
    config = pickle.loads(payload)
    from acollect._workers.main import run_worker

    exit_now(run_worker(config))


def _forkserver_entry(data: bytes) -> None:
    # First: a Ctrl-C is the trainer's to act on (see acollect._runtime.spawn); the spawn bootstrap does the same.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    path, payload = pickle.loads(data)
    sys.path[:0] = [p for p in path if p not in sys.path]
    _run_payload(payload)


class WorkerProcess:
    """One local worker process: its pid, exit code, and ways to end it."""

    def __init__(self, handle: subprocess.Popen[bytes] | Any, payload: bytes | None) -> None:
        self._handle = handle
        self._payload = payload
        self._pid = int(handle.pid)  # kept: a closed multiprocessing.Process no longer says
        self._exitcode: int | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        return self._pid

    @property
    def exitcode(self) -> int | None:
        """``None`` while it runs; negative when a signal ended it. Reaps the process once it is gone."""
        if self._exitcode is None:
            handle = self._handle
            self._exitcode = handle.poll() if isinstance(handle, subprocess.Popen) else handle.exitcode
        return self._exitcode

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.exitcode is None

    def describe(self) -> str:
        """``"pid <pid>"``: how error messages name this worker."""
        return f"pid {self.pid}"

    def write_config(self) -> None:
        """Hands the config over (blocking: call it off the event loop)."""
        payload, self._payload = self._payload, None
        if payload is not None and isinstance(self._handle, subprocess.Popen):
            stdin = self._handle.stdin
            assert stdin is not None
            try:
                stdin.write(payload)
                stdin.close()
            except (BrokenPipeError, OSError):
                pass  # it died before reading: its exit code tells why

    def terminate(self) -> None:
        """Sends SIGTERM (no-op once it exited)."""
        if self.exitcode is None:
            try:
                self._handle.terminate()
            except (ProcessLookupError, OSError):
                pass

    def kill(self) -> None:
        """Sends SIGKILL (no-op once it exited)."""
        if self.exitcode is None:
            try:
                self._handle.kill()
            except (ProcessLookupError, OSError):
                pass

    def close(self) -> None:
        """Releases the handle's pipes (a process killed a moment ago is reaped once it exited, without waiting)."""
        if isinstance(self._handle, subprocess.Popen):
            if self._handle.stdin is not None and not self._handle.stdin.closed:
                try:
                    self._handle.stdin.close()
                except OSError:
                    pass
            if self._handle.poll() is None:
                reap_later(self._handle)
        elif self.exitcode is not None:
            self._handle.close()


def check_start_method(start_method: str) -> None:
    """Refuses a start method that cannot start workers from this process, before any worker starts.

    Raises:
        ConfigurationError: ``start_method`` is unknown; or it is ``"forkserver"`` where the platform has no fork
            server, or in a daemonic multiprocessing process (a ``multiprocessing.Pool`` worker), whose children
            multiprocessing forbids (the message names ``start_method="spawn"``, which works in both).

    Examples:
        >>> check_start_method("spawn")
        >>> check_start_method("fork")
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: start_method='fork' is invalid: expected one of ('spawn', 'forkserver').
    """
    if start_method not in START_METHODS:
        raise ConfigurationError.bad_value("start_method", start_method, f"one of {START_METHODS}")
    if start_method != "forkserver":
        return
    if not forkserver.AVAILABLE:
        raise ConfigurationError.bad_value(
            "start_method", start_method, f"'spawn' here: this platform ({sys.platform}) has no fork server"
        )
    if multiprocessing.current_process().daemon:
        raise ConfigurationError.bad_value(
            "start_method",
            start_method,
            f"'spawn' in this process: {multiprocessing.current_process().name} is a daemonic multiprocessing "
            "process (a multiprocessing.Pool worker, or a Process with daemon=True), whose children multiprocessing "
            "forbids; spawned workers are not multiprocessing's",
        )


def start_worker(config: WorkerConfig, *, start_method: str = DEFAULT_START_METHOD) -> WorkerProcess:
    """Starts a worker process for ``config``; call :meth:`WorkerProcess.write_config` next (spawn).

    Raises:
        ConfigurationError: ``start_method`` cannot start workers here (see :func:`check_start_method`), or the
            config cannot be pickled.
    """
    check_start_method(start_method)
    payload = pickle_payload(
        config,
        what=f"the env factory or policy to worker {config.index}",
        hint="it must be picklable with cloudpickle; pass policy_factory to build the policy inside the worker",
    )
    if start_method == "forkserver":
        process = forkserver.start_process(_forkserver_entry, payload, name=f"acollect-worker-{config.index}")
        return WorkerProcess(process, None)
    return WorkerProcess(spawn_python(_BOOTSTRAP, num_threads=config.num_threads), payload)
