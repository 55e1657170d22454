"""Fresh Python interpreters handed a cloudpickled config on their stdin: how worker and server processes start.

``python -c <bootstrap>`` first ignores SIGINT, then reads the payload before importing anything heavy (so the
parent's write never waits on the child importing torch), takes the parent's import path (so that acollect and
the modules defining the user's factories import there as they did here), then calls the entry point with the
cloudpickled config. The entry point ends with :func:`exit_now`.

Why SIGINT is ignored: Ctrl-C in a terminal signals the whole process group, children included. Whether the
program ends is the trainer's decision (its ``KeyboardInterrupt``), and a child that took it too would only print
its own traceback; the child ends when the trainer tells it to stop, or when the trainer is gone (each child
watches it). So that a Ctrl-C during start-up is quiet too, the child is started with SIGINT blocked (the thread
that starts it blocks it for the moment of the start, and a child inherits its mask across ``exec``): one that
arrives while the interpreter starts waits, and the bootstrap's first statements ignore it (which discards one
waiting) and unblock it. CPython starts its resource tracker the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from acollect._pickling import cloudpickle_dumps
from acollect.errors import ConfigurationError

__all__ = ["bootstrap", "exit_now", "pickle_payload", "reap_later", "sigint_blocked", "spawn_python"]

#: Processes killed and not reaped yet (see :func:`reap_later`).
_unreaped: list[subprocess.Popen[bytes]] = []

#: Whether SIGINT can be blocked while a child starts (POSIX; not Windows, where Ctrl-C is no signal to a group).
_HAVE_SIGMASK = hasattr(signal, "pthread_sigmask")

#: The bootstrap's first statements: a Ctrl-C is the trainer's (see the module docstring).
_IGNORE_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); " + (
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); " if _HAVE_SIGMASK else ""
)


def bootstrap(module: str, function: str) -> str:
    """The ``-c`` code of a process whose entry point is ``module.function(payload)``.

    Examples:
        >>> "from acollect._workers.process import _run_payload; _run_payload(payload)" in bootstrap(
        ...     "acollect._workers.process", "_run_payload")
        True
    """
    return _IGNORE_SIGINT + (
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
    """Starts ``python -c code`` with a stdin pipe for the payload and ``num_threads`` OpenMP/MKL threads.

    ``code`` comes from :func:`bootstrap`: the child starts with SIGINT blocked, and the bootstrap unblocks it.
    """
    _reap()
    threads = str(num_threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    with sigint_blocked():
        return subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, env=env, close_fds=True, pass_fds=tuple(pass_fds)
        )


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """Blocks SIGINT in this thread meanwhile: children started meanwhile begin with it blocked.

    Here, a Ctrl-C meanwhile waits (for a process start: about a millisecond) and is then delivered as usual;
    in any other thread of the process, it is delivered at once.
    """
    if not _HAVE_SIGMASK:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def exit_now(code: int) -> None:
    """Ends the process with ``code`` once everything it owns is closed.

    A normal interpreter exit would wait for pyzmq's zero-copy garbage-collector thread and library atexit hooks,
    which can take seconds (or abort) in a process that sent frames without copying.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
