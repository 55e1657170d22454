"""Workers forked from multiprocessing's fork server: what the server preloads, how a worker is forked, what it leaves.

``start_method="forkserver"`` (the default where the platform has a fork server: Linux and macOS, not Windows)
starts each worker as a fork of one server process per program, which imported the worker's code once: a worker
starts in milliseconds and shares the server's modules (its own memory is about 14 MiB), where a spawned one is a
fresh interpreter importing them again (seconds of CPU and 231 MiB each: on 2 cores, 32 forked workers reached
their first batch in 3.5 s, 32 spawned ones in 72 s; ``benchmarks/startup.py``).

**What the server preloads** (:data:`PRELOADED_MODULES`, chosen on purpose): torch, tensordict, gymnasium and the
worker loop (:mod:`acollect._workers.main`, which imports the rest of the worker's code): what every worker imports,
and nothing that touches CUDA. The user's ``__main__`` is never imported there, nor in a worker (see below).

**Why forking from it is safe with CUDA.** A process forked from one that initialised CUDA cannot use CUDA (the
driver's state does not survive ``fork``: "Cannot re-initialize CUDA in forked subprocess"), and even
``torch.cuda.is_available()`` initialises the driver (unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``). The server
never touches CUDA: multiprocessing starts it as a fresh interpreter (fork and exec, so nothing of the trainer's
CUDA state reaches it), importing the preloaded modules calls nothing in ``torch.cuda`` (a test wraps torch's CUDA
entry points and imports them as the server does), and after that the server only forks. Each worker so starts
with CUDA untouched and initialises it itself when its policy or env first uses a GPU, as a spawned worker does.

**The user's** ``__main__``. multiprocessing has every child of the fork server run the parent's main module again
(as ``__mp_main__``) before it unpickles the process object, so that functions defined there unpickle by
reference. A script without an ``if __name__ == "__main__":`` guard then starts its collector again inside each
worker, which multiprocessing refuses (the worker dies with exit code 1). A worker needs none of it: its entry
point is in :mod:`acollect._workers.process` and its config is cloudpickled (functions and classes of ``__main__``
by value). So :func:`start_process` hands the server multiprocessing's own preparation data less the two entries
that name the main module: a script without the guard, ``python -c``, a notebook and code run by ``exec`` all
start workers alike.

**Its listener.** The process that starts the server binds the server's listening socket at
``<temp dir>/pymp-XXXX/listener-XXXX``, and multiprocessing removes that directory when this process exits
normally. A process that is killed (``SIGKILL``, the OOM killer) runs no exit hook, so the directory stayed in the
temp dir for good, one per killed trainer. The server outlives that process by a moment: it exits, normally, once
no process that may ask it for a fork is left. This module is preloaded there (:data:`PRELOAD`), and when the
server exits it removes the socket, and the ``pymp-`` directory if nothing else is in it. The server can serve
nobody by then, so no other user of multiprocessing loses anything; whatever else the directory holds belongs to
someone else and stays.

**Ctrl-C** (SIGINT, which a terminal sends to the whole process group): the server ignores it once it serves,
and its workers from their entry point on (:mod:`acollect._workers.process`), so that the trainer alone decides,
and nothing else prints a traceback. Before it serves, while it imports the worker's code (torch: seconds), a
trainer waiting for its first worker would wait for that import to end, so there a Ctrl-C ends the server at
once, silently (SIGINT's default action): the waiting start fails, and multiprocessing starts another server
when one is needed next. The server is started with SIGINT blocked (as a spawned worker is,
:mod:`acollect._runtime.spawn`), so that one arriving while its interpreter starts waits until this module takes over;
after the import, the server's handler is put back, so that the other children of a server the program shares
keep theirs.

The server is multiprocessing's, one per program: it lives until the program ends (with the resource tracker
multiprocessing starts beside it), and its environment variables are the program's when it started. A fork
server the program started before with other preloads is used as it is (workers then import what it lacks).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import sys
import types
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

from acollect._runtime.spawn import sigint_blocked

__all__ = ["AVAILABLE", "PRELOAD", "PRELOADED_MODULES", "start_process"]

#: Whether this platform has a fork server (not Windows).
AVAILABLE = "forkserver" in multiprocessing.get_all_start_methods()

#: The modules the fork server imports before it forks any worker, in this order: what every worker imports, and
#: nothing that touches CUDA (see the module docstring).
PRELOADED_MODULES = ("torch", "tensordict", "gymnasium", "acollect._workers.main")

#: What multiprocessing is told to preload: this module, which imports :data:`PRELOADED_MODULES` (a Ctrl-C
#: meanwhile ending the server, silently) and removes the server's listener when the server exits.
PRELOAD = [__name__]

#: The entries of multiprocessing's preparation data that name the parent's main module (Python 3.8 to 3.14).
_MAIN_MODULE_ENTRIES = ("init_main_from_name", "init_main_from_path")


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


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


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
    """Imports :data:`PRELOADED_MODULES` (torch: seconds), a Ctrl-C meanwhile ending the server silently; then puts
    the server's SIGINT handler back."""
    # The default action, not KeyboardInterrupt: that would print the server's traceback beside the trainer's.
    # Put back after: the server's loop ignores SIGINT itself, and hands the handler it found to the children it
    # forks, which may not be ours.
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        # Blocked by the thread that started the server: one that came meanwhile ends it here.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        for module in PRELOADED_MODULES:
            importlib.import_module(module)
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be set back from here
            signal.signal(signal.SIGINT, previous)


if AVAILABLE:
    from multiprocessing import context, popen_forkserver, spawn, util

    class _Popen(popen_forkserver.Popen):
        """multiprocessing's start of a fork-server child, less the parent's main module."""

        _fds: list[int]  # descriptors handed to the child (set by popen_forkserver.Popen, which typeshed omits)

        def _launch(self, process_obj: Any) -> None:
            # popen_forkserver.Popen._launch (unchanged from Python 3.8 to 3.14), the preparation data less the
            # entries that would have the child run the parent's main module again.
            prep_data = spawn.get_preparation_data(process_obj._name)
            for entry in _MAIN_MODULE_ENTRIES:
                prep_data.pop(entry, None)
            buf = io.BytesIO()
            context.set_spawning_popen(self)
            try:
                reduction.dump(prep_data, buf)
                reduction.dump(process_obj, buf)
            finally:
                context.set_spawning_popen(None)
            self.sentinel, w = multiprocessing.forkserver.connect_to_new_process(self._fds)
            # The write end's duplicate is the child's sentinel of this process (multiprocessing keeps it so too).
            parent_w = os.dup(w)
            self.finalizer = util.Finalize(self, _close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = multiprocessing.forkserver.read_signed(self.sentinel)

    class _Process(context.ForkServerProcess):
        """A fork-server process started by :class:`_Popen`."""

        @staticmethod
        def _Popen(process_obj: Any) -> _Popen:
            return _Popen(process_obj)


class _Descriptor:
    """A descriptor of this process, pickled for a fork-server child: multiprocessing sends it along with the fork
    request (as it sends any descriptor there), and the child unpickles the number it has there."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (reduction.DupFd(self.fd),))


def _received(sent: Any) -> int:
    return int(sent.detach())


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _run_child(target: Callable[[bytes], None], data: bytes, stdio: list[tuple[int, int]]) -> None:
    """A fork-server child's entry: its stdout and stderr made this process's (see :func:`start_process`), then
    ``target(data)``."""
    for fd, received in stdio:
        os.dup2(received, fd)
        os.close(received)
    target(data)


def start_process(target: Callable[[bytes], None], data: bytes, *, name: str) -> multiprocessing.process.BaseProcess:
    """Starts ``target(data)`` in a daemon process forked from the fork server (started first if need be).

    ``target`` must be importable by name in the server (a module-level function of acollect's); ``data`` is
    handed over pickled, through the start's own pipe. The child writes to this process's stdout and stderr as
    they are now (as a spawned worker would), not to those the server inherited when it started: a program (or
    pytest's capture) that moved them since sees its workers' output where its own goes.
    """
    ctx = multiprocessing.get_context("forkserver")
    # The server imports the worker code once (every worker is then a cheap fork of it), and removes its listener
    # when it exits, which multiprocessing leaves behind when this process is killed.
    ctx.set_forkserver_preload(PRELOAD)
    # Started (once) with SIGINT blocked, as a spawned child is: its preload unblocks it. The resource tracker it
    # starts first unblocks SIGINT in this thread after its own start: started before.
    multiprocessing.resource_tracker.ensure_running()
    with sigint_blocked():
        multiprocessing.forkserver.ensure_running()
    stdio = [(fd, _Descriptor(fd)) for fd in (1, 2) if _open(fd)]
    process = _Process(target=_run_child, args=(target, data, stdio), name=name, daemon=True)
    process.start()
    return process


if _imported_by_the_fork_server():
    atexit.register(_remove_listener)
    _import_worker_code()
