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
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.forkserver
import os
import sys
import types

__all__ = ["PRELOAD"]

#: The modules the fork server imports before it forks any worker: the worker's code, so that each
#: worker is a cheap fork of a process that imported torch once, and this module.
PRELOAD = ["acollect.worker.main", __name__]


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


if _imported_by_the_fork_server():
    atexit.register(_remove_listener)
