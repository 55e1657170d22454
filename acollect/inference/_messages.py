"""The messages between inference clients (env workers) and an inference server.

A request carries a client's observations as raw tensor frames (:mod:`acollect._runtime.wire`) and a
sequence number; the reply carries the policy's outputs, the same number, and the version of the
weights that produced them. A client that gave up on a request (paused mid-step) recognises the late
reply by its number and drops it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["REPLY", "REQUEST", "TO_CLIENT", "TO_SERVER", "copy_frames"]

logger = logging.getLogger("acollect")

REQUEST = "infer"
REPLY = "act"
TO_SERVER = frozenset({REQUEST})
TO_CLIENT = frozenset({REPLY})

# Below this, ZeroMQ copying the frames costs less than tracking buffers it does not own (a zero-copy send of
# a few hundred bytes took most of a server's time per step).
_ZERO_COPY_BYTES = 64 * 1024


def copy_frames(frames: Sequence[Any]) -> bool:
    """Whether to send ``frames`` by copy (small messages) rather than zero-copy (large ones)."""
    return sum(memoryview(f).nbytes for f in frames) < _ZERO_COPY_BYTES
