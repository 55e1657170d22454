"""What a worker does about a collector process that is gone: notice it, and clean up after it.

A local worker watches its parent process (the collector's, or the fork server's, which
exits with it). When it is gone, the worker removes what the dead collector can no
longer remove itself: its shared-memory segments (every one its name says it owned,
not only those the worker attached), and its private ipc file. Workers with no parent to
watch (started by hand, or by an engine on another host) rely on the collector's heartbeats
instead (:mod:`acollect._workers.main`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from acollect._batches.shm import SHM_DIR, SHM_PREFIX, _pid_alive

__all__ = ["parent_alive", "remove_orphans"]


def parent_alive(parent_pid: int, ppid: int) -> bool:
    """Whether the collector's process ``parent_pid`` lives, and this process is still the child of ``ppid``."""
    # A forkserver child's parent is the fork server, which exits when the collector's
    # process dies; a spawned worker's parent is the collector's process itself.
    return os.getppid() == ppid and _pid_alive(parent_pid)


def remove_orphans(parent_pid: int, segment_names: Iterable[str], address: str) -> None:
    """Removes the dead collector's segments (``segment_names``, and every other its pid names), and its private
    ipc file at ``address``."""
    # Only the owner unlinks a segment while it lives; it is gone now (killed, or out of memory), and
    # its segments would otherwise stay in /dev/shm until reboot. Every worker tries; the first one wins.
    owned = f"{SHM_PREFIX}{parent_pid}-"
    names = {name for name in segment_names if name.startswith(owned)}
    # Every segment the dead collector owned, not only those this worker attached: one it made just before it died
    # (a ring grown for lent batches, its names still on their way here) has no other process to remove it.
    if not _pid_alive(parent_pid):  # checked again: a pid taken by a new process owns what its name says
        with contextlib.suppress(OSError):
            names.update(name for name in os.listdir(SHM_DIR) if name.startswith(owned))
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
    path = address.removeprefix("ipc://")
    if path != address and os.path.basename(os.path.dirname(path)).startswith("acollect-"):
        with contextlib.suppress(OSError):  # the endpoint's private directory (see Endpoint)
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
