"""Fresh Python interpreters handed a cloudpickled config on their stdin: how worker and server processes start.

``python -c <bootstrap>`` reads the payload before importing anything heavy (so the parent's write never waits
on the child importing torch), takes the parent's import path (so that acollect and the modules defining the
user's factories import there as they did here), then calls the entry point with the cloudpickled config. The
entry point ends with :func:`exit_now`.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import cloudpickle

from acollect.errors import ConfigurationError

__all__ = ["bootstrap", "exit_now", "pickle_payload", "spawn_python"]


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
        return pickle.dumps((list(sys.path), cloudpickle.dumps(config)))
    except Exception as exc:
        raise ConfigurationError(f"cannot send {what}: {type(exc).__name__}: {exc} ({hint})") from exc


def spawn_python(code: str, *, num_threads: int, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Starts ``python -c code`` with a stdin pipe for the payload and ``num_threads`` OpenMP/MKL threads."""
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
