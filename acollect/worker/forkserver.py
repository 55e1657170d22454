"""The fork server's side of ``start_method="forkserver"``: what it preloads, and the listener it leaves behind.

multiprocessing starts one fork server per program. The process that starts it binds the server's
listening socket at ``<temp dir>/pymp-XXXX/listener-XXXX``, and multiprocessing removes that
directory when this process exits normally. A process that is killed (``SIGKILL``, the OOM killer)
runs no exit hook, so the directory stayed in the temp dir for good, one per killed trainer.

The fork server outlives that process by a moment: it exits, normally, once no process that may ask
it for a fork is left. This module is preloaded there (:data:`PRELOAD`), and when the server exits it
removes the socket, and the ``pymp-`` directory if nothing else is in it. The server can serve nobody
by then, so no other user of multiprocessing loses anything; whatever else the directory holds belongs
to someone else and stays.

Ctrl-C (SIGINT, which a terminal sends to the whole process group): the server ignores it once it serves,
and its workers from their entry point on (:mod:`acollect.worker.process`), so that the trainer alone decides,
and nothing else prints a traceback. Before it serves, while it imports the worker's code (torch: seconds), a
trainer waiting for its first worker would wait for that import to end, so there a Ctrl-C ends the server at
once, silently (SIGINT's default action): the waiting start fails, and multiprocessing starts another server
when one is needed next. The server is started with SIGINT blocked (as a spawned worker is,
:mod:`acollect._spawn`), so that one arriving while its interpreter starts waits until this module takes over;
after the import, the server's handler is put back, so that the other children of a server the program shares
keep theirs.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing.forkserver
import os
import signal
import sys
import types

__all__ = ["PRELOAD"]

#: The modules the fork server imports before it forks any worker: this module, which imports the worker's code
#: (so that each worker is a cheap fork of a process that imported torch once).
PRELOAD = [__name__]

#: What this module imports in the fork server (a Ctrl-C meanwhile ends the server, silently).
_WORKER_CODE = "acollect.worker.main"


def _remove_listener() -> None:
    """Removes the fork server's listening socket and, once empty, its ``pymp-`` directory."""
    # Set by multiprocessing.forkserver.main (Python 3.8 to 3.13) in the server process; where a version
    # keeps it elsewhere, the directory is left as multiprocessing leaves it.
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    address = getattr(server, "_forkserver_address", None)
    if not isinstance(address, str) or not address or address.startswith("\0"):
        return  # unknown, or an abstract socket: nothing on disk
    with contextlib.suppress(OSError):  # gone already: the process that started the server exited normally
        os.unlink(address)
    directory = os.path.dirname(address)
    if os.path.basename(directory).startswith("pymp-"):
        with contextlib.suppress(OSError):  # not empty: what else is there is not the server's
            os.rmdir(directory)


def _imported_by_the_fork_server() -> bool:
    """Whether multiprocessing's fork server is importing this module (its preload), not any other process."""
    server_main = getattr(getattr(multiprocessing.forkserver, "main", None), "__code__", None)
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is server_main:
            return True
        frame = frame.f_back
    return False


def _import_worker_code() -> None:
    """Imports the worker's code (torch: seconds), a Ctrl-C meanwhile ending the server silently; then puts the
    server's SIGINT handler back."""
    # The default action, not KeyboardInterrupt: that would print the server's traceback beside the trainer's.
    # Put back after: the server's loop ignores SIGINT itself, and hands the handler it found to the children it
    # forks, which may not be ours.
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        # Blocked by the thread that started the server: one that came meanwhile ends it here.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        importlib.import_module(_WORKER_CODE)
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be set back from here
            signal.signal(signal.SIGINT, previous)


if _imported_by_the_fork_server():
    atexit.register(_remove_listener)
    _import_worker_code()
