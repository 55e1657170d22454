"""What a worker does about a collector process that is gone: notice it, and clean up after it.

A local worker watches its parent process (the collector's, or the fork server's, which
exits with it). When it is gone, the worker removes what the dead collector can no
longer remove itself: its shared-memory segments that the worker knows, and its
private ipc file. Workers with no parent to watch (started by hand, or by an engine on
another host) rely on the collector's heartbeats instead (:mod:`acollect.worker.main`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from acollect.transport.shm import SHM_DIR, SHM_PREFIX

__all__ = ["parent_alive", "remove_orphans"]


def parent_alive(parent_pid: int, ppid: int) -> bool:
    """Whether the collector's process ``parent_pid`` lives, and this process is still the child of ``ppid``."""
    # A forkserver child's parent is the fork server, which exits when the collector's
    # process dies; a spawned worker's parent is the collector's process itself.
    if os.getppid() != ppid:
        return False
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_orphans(parent_pid: int, segment_names: Iterable[str], address: str) -> None:
    """Removes the dead collector's segments among ``segment_names``, and its private ipc file at ``address``."""
    # Only the owner unlinks a segment while it lives; it is gone now (killed, or out of memory), and
    # its segments would otherwise stay in /dev/shm until reboot. Every worker tries; the first one wins.
    owned = f"{SHM_PREFIX}{parent_pid}-"
    for name in segment_names:
        if name.startswith(owned):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
    path = address.removeprefix("ipc://")
    if path != address and os.path.basename(os.path.dirname(path)).startswith("acollect-"):
        with contextlib.suppress(OSError):  # the endpoint's private directory (see Endpoint)
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
