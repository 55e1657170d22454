"""The messages between inference clients (env workers) and an inference server.

A request carries a client's observations as raw tensor frames (:mod:`acollect.transport.wire`) and a
sequence number; the reply carries the policy's outputs, the same number, and the version of the
weights that produced them. A client that gave up on a request (paused mid-step) recognises the late
reply by its number and drops it.
"""

from __future__ import annotations

import logging

__all__ = ["REPLY", "REQUEST", "TO_CLIENT", "TO_SERVER"]

logger = logging.getLogger("acollect")

REQUEST = "infer"
REPLY = "act"
TO_SERVER = frozenset({REQUEST})
TO_CLIENT = frozenset({REPLY})
