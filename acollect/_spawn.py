"""Fresh Python interpreters handed a cloudpickled config on their stdin: how worker and server processes start.

``python -c <bootstrap>`` reads the payload before importing anything heavy (so the parent's write never waits
on the child importing torch), takes the parent's import path (so that acollect and the modules defining the
user's factories import there as they did here), then calls the entry point with the cloudpickled config. The
entry point ends with :func:`exit_now`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from acollect._pickling import cloudpickle_dumps
from acollect.errors import ConfigurationError

__all__ = ["bootstrap", "exit_now", "pickle_payload", "reap_later", "spawn_python"]

#: Processes killed and not reaped yet (see :func:`reap_later`).
_unreaped: list[subprocess.Popen[bytes]] = []


def bootstrap(module: str, function: str) -> str:
    """The ``-c`` code of a process whose entry point is ``module.function(payload)``.

    Examples:
        >>> "from acollect.worker.process import _run_payload; _run_payload(payload)" in bootstrap(
        ...     "acollect.worker.process", "_run_payload")
        True
    """
    return (
        "import sys, pickle; path, payload = pickle.loads(sys.stdin.buffer.read()); sys.stdin.close(); "
        "sys.path[:0] = [p for p in path if p not in sys.path]; "
        f"from {module} import {function}; {function}(payload)"
    )


def pickle_payload(config: Any, *, what: str, hint: str) -> bytes:
    """``config`` cloudpickled, with this process's import path, as :func:`bootstrap` reads it.

    Raises:
        ConfigurationError: ``config`` cannot be pickled (the message names ``what`` could not be sent and ``hint``).
    """
    try:
        return pickle.dumps((list(sys.path), cloudpickle_dumps(config)))
    except Exception as exc:
        raise ConfigurationError(f"cannot send {what}: {type(exc).__name__}: {exc} ({hint})") from exc


def reap_later(popen: subprocess.Popen[bytes]) -> None:
    """Keeps a process that was just killed until its exit is reaped, without waiting for it now.

    Where nothing may wait (a finalizer, an event loop's end), a killed child may not have exited yet; dropped,
    its ``Popen`` would warn that it "is still running". Kept here, it is reaped by the next call (or a spawn).
    """
    _unreaped.append(popen)
    _reap()


def _reap() -> None:
    _unreaped[:] = [p for p in _unreaped if p.poll() is None]


@atexit.register
def _reap_at_exit() -> None:
    # Before the interpreter's teardown, where a Popen can no longer reap its child: a process killed a moment
    # ago (one in the middle of a system call dies when it returns) gets a short, bounded while to exit.
    deadline = time.monotonic() + 2.0
    for popen in _unreaped:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    _reap()


def spawn_python(code: str, *, num_threads: int, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Starts ``python -c code`` with a stdin pipe for the payload and ``num_threads`` OpenMP/MKL threads."""
    _reap()
    threads = str(num_threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, env=env, close_fds=True, pass_fds=tuple(pass_fds)
    )


def exit_now(code: int) -> None:
    """Ends the process with ``code`` once everything it owns is closed.

    A normal interpreter exit would wait for pyzmq's zero-copy garbage-collector thread and library atexit hooks,
    which can take seconds (or abort) in a process that sent frames without copying.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
