"""Checks that code driving collectors leaves nothing behind.

A collector owns worker processes, shared-memory segments in ``/dev/shm``,
threads and ZeroMQ sockets, and must release all of them on
``async_shutdown()``, on a crash and on a cancellation. These helpers compare
what this process holds now with a :class:`ResourceSnapshot` taken before:

* :func:`our_children`: live descendant processes (multiprocessing's own fork
  server and resource tracker excepted; their forks count);
* :func:`our_segments`: ``/dev/shm`` segments a process created
  (``acollect-<pid>-...``);
* :func:`our_threads`: threads acollect started (named ``acollect-...``);
* :func:`open_fds`: file descriptors open in this process (ZeroMQ sockets
  and contexts hold some).

:func:`leaked_resources` waits a little for leftovers to go (a killed process
takes a moment to be reaped) and describes what stayed;
:func:`assert_no_leaks` and :func:`no_leaks` turn that into a test failure.

Examples:
    >>> from acollect.testing import ResourceSnapshot, leaked_resources, no_leaks
    >>> before = ResourceSnapshot.take()
    >>> leaked_resources(before, timeout=0.1)
    []
    >>> with no_leaks(timeout=0.1):
    ...     pass  # start and shut down a collector here
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from acollect._batches.shm import SHM_DIR, SHM_PREFIX
from acollect._runtime.threads import THREAD_NAME_PREFIX

__all__ = [
    "ResourceSnapshot",
    "assert_no_leaks",
    "leaked_resources",
    "no_leaks",
    "open_fds",
    "our_children",
    "our_segments",
    "our_threads",
]

_POLL = 0.02


def _multiprocessing_helpers() -> set[int]:
    """Pids of multiprocessing's own long-lived helpers (fork server, resource tracker): not ours to stop."""
    from multiprocessing import forkserver, resource_tracker

    pids = set()
    for pid in (
        getattr(forkserver._forkserver, "_forkserver_pid", None),
        getattr(resource_tracker._resource_tracker, "_pid", None),
    ):
        if pid:
            pids.add(pid)
    return pids


def our_children() -> frozenset[int]:
    """Pids of the live descendants of this process.

    Zombies (exited, not yet reaped) do not count, nor do multiprocessing's
    fork server and resource tracker, which live as long as the program by
    design; processes forked *by* the fork server (forkserver workers) do.

    Examples:
        >>> import subprocess, sys
        >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        >>> child.pid in our_children()
        True
        >>> child.kill(); child.wait()
        -9
        >>> child.pid in our_children()
        False
    """
    helpers = _multiprocessing_helpers()
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in helpers or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        found.add(proc.pid)
    return frozenset(found)


def our_segments(owner: int | None = None) -> frozenset[str]:
    """Names of the acollect shared-memory segments in ``/dev/shm`` created by process ``owner``.

    Args:
        owner: a process id; ``None`` for this process. Segments are named
            ``acollect-<owner pid>-<random>``, so the segments of a process
            that was killed can be looked for too.

    Examples:
        >>> from acollect._batches.shm import ShmSegment
        >>> segment = ShmSegment.create(64)
        >>> segment.name in our_segments()
        True
        >>> segment.unlink(); segment.close()
        >>> segment.name in our_segments()
        False
    """
    prefix = f"{SHM_PREFIX}{os.getpid() if owner is None else owner}-"
    try:
        return frozenset(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    except FileNotFoundError:  # pragma: no cover - no /dev/shm here
        return frozenset()


def our_threads() -> frozenset[str]:
    """Names of the live threads acollect started in this process (prefixed ``"acollect-"``).

    Examples:
        >>> import threading
        >>> t = threading.Thread(target=threading.Event().wait, args=(5,), name="acollect-demo", daemon=True)
        >>> t.start()
        >>> "acollect-demo" in our_threads()
        True
    """
    return frozenset(t.name for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX) and t.is_alive())


def open_fds() -> int:
    """How many file descriptors this process has open (ZeroMQ sockets and contexts hold some).

    Examples:
        >>> before = open_fds()
        >>> r, w = os.pipe()
        >>> open_fds() - before
        2
        >>> os.close(r); os.close(w)
    """
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # listing the directory opens one itself
    except FileNotFoundError:  # pragma: no cover - not Linux
        return int(psutil.Process().num_fds())


@dataclass(frozen=True)
class ResourceSnapshot:
    """What this process held at one moment: the baseline of a leak check.

    Attributes:
        children: pids of live descendant processes (see :func:`our_children`).
        segments: this process's ``/dev/shm`` segments (see :func:`our_segments`).
        threads: names of live acollect threads (see :func:`our_threads`).
        fds: open file descriptors (see :func:`open_fds`).

    Examples:
        >>> snapshot = ResourceSnapshot.take()
        >>> snapshot.fds > 0
        True
    """

    children: frozenset[int]
    segments: frozenset[str]
    threads: frozenset[str]
    fds: int

    @classmethod
    def take(cls) -> ResourceSnapshot:
        """Records what this process holds now."""
        return cls(children=our_children(), segments=our_segments(), threads=our_threads(), fds=open_fds())


def _describe(before: ResourceSnapshot, fds_slack: int | None) -> list[str]:
    now = ResourceSnapshot.take()
    left: list[str] = []
    children = now.children - before.children
    if children:
        left.append(f"worker processes left running: {_processes(children)}")
    segments = now.segments - before.segments
    if segments:
        left.append(f"shared-memory segments left in {SHM_DIR}: {sorted(segments)}")
    threads = now.threads - before.threads
    if threads:
        left.append(f"acollect threads left running: {sorted(threads)}")
    if fds_slack is not None and now.fds > before.fds + fds_slack:
        left.append(
            f"file descriptors left open: {now.fds} now, {before.fds} before "
            f"({now.fds - before.fds - fds_slack} more than the slack of {fds_slack})"
        )
    return left


def _process(pid: int) -> str:
    """``"<pid> (<command line>)"``, to tell a worker from a stray helper in a failure message."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())[:80]
    except psutil.Error:
        return str(pid)
    return f"{pid} ({command or '?'})"


def _processes(pids: frozenset[int]) -> str:
    return ", ".join(_process(pid) for pid in sorted(pids))


def leaked_resources(before: ResourceSnapshot, *, timeout: float = 5.0, fds_slack: int | None = None) -> list[str]:
    """Describes what this process holds beyond ``before``, after waiting up to ``timeout`` for it to go.

    Args:
        before: the baseline, taken before the code under test ran.
        timeout: seconds to wait for leftovers to disappear (a killed worker
            takes a moment to be reaped, a thread to be joined).
        fds_slack: ``None`` ignores file descriptors; an int counts as a leak
            any fds open beyond ``before.fds + fds_slack``. Libraries open
            some once per process (pyzmq's garbage collector, a fork server's
            pipe): take the baseline after a first warm-up run, or allow a slack.

    Returns:
        One human-readable line per kind of leftover (worker processes,
        shared-memory segments, acollect threads, file descriptors); an empty
        list when nothing is left.

    Examples:
        >>> import threading
        >>> before = ResourceSnapshot.take()
        >>> stop = threading.Event()
        >>> t = threading.Thread(target=stop.wait, name="acollect-forgotten")
        >>> t.start()
        >>> leaked_resources(before, timeout=0.05)
        ["acollect threads left running: ['acollect-forgotten']"]
        >>> stop.set(); t.join()
        >>> leaked_resources(before, timeout=0.05)
        []
    """
    deadline = time.monotonic() + timeout
    while True:
        left = _describe(before, fds_slack)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL)


def assert_no_leaks(before: ResourceSnapshot, *, timeout: float = 5.0, fds_slack: int | None = None) -> None:
    """Fails if this process holds more than ``before`` once ``timeout`` seconds have passed.

    Args:
        before: the baseline, taken before the code under test ran.
        timeout: seconds to wait for leftovers to disappear.
        fds_slack: see :func:`leaked_resources`.

    Raises:
        AssertionError: listing every kind of leftover.

    Examples:
        >>> before = ResourceSnapshot.take()
        >>> assert_no_leaks(before, timeout=0.1, fds_slack=0)
    """
    left = leaked_resources(before, timeout=timeout, fds_slack=fds_slack)
    if left:
        raise AssertionError("resources left behind: " + "; ".join(left))


@contextmanager
def no_leaks(*, timeout: float = 5.0, fds_slack: int | None = None) -> Iterator[ResourceSnapshot]:
    """Takes a :class:`ResourceSnapshot` on entry and calls :func:`assert_no_leaks` on a normal exit.

    A plain (sync) context manager: around async code too, since it only takes
    a snapshot before and checks after. When the block raises, its exception
    goes through unchanged and nothing is checked.

    Args:
        timeout: seconds to wait for leftovers to disappear.
        fds_slack: see :func:`leaked_resources`.

    Yields:
        The baseline snapshot.

    Raises:
        AssertionError: something was left behind.

    Examples:
        >>> import anyio
        >>> from acollect import Collector
        >>> from acollect.testing import CountingEnv
        >>> async def main():
        ...     with no_leaks():
        ...         async with Collector(CountingEnv, frames_per_batch=4, total_frames=8) as collector:
        ...             return [batch.numel() async for batch in collector]
        >>> anyio.run(main)
        [4, 4]

        As an autouse pytest fixture::

            @pytest.fixture(autouse=True)
            def check_leaks():
                with no_leaks():
                    yield
    """
    before = ResourceSnapshot.take()
    yield before
    assert_no_leaks(before, timeout=timeout, fds_slack=fds_slack)
