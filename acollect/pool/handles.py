"""What the collector knows about each worker, what it received from one, and what every worker is told."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase

from acollect.launchers.base import LaunchedWorker
from acollect.transport.shm_ring import ShmSlotRing
from acollect.weights import WeightStructure
from acollect.worker import protocol as P

__all__ = ["Orders", "Received", "Rejected", "Request", "Retired", "WorkerHandle", "parse_identity"]

# ``w<index>.<generation>`` (control socket) or the same plus ``d`` (data socket): see worker_identity.
_IDENTITY = re.compile(rb"w(\d{1,9})\.(\d{1,9})d?")


def parse_identity(identity: bytes) -> tuple[int, int] | None:
    """``(worker index, generation)`` from a ZeroMQ identity, or ``None`` if it names no worker."""
    match = _IDENTITY.fullmatch(identity)
    if match is None:
        return None
    return int(match[1]), int(match[2])


class Rejected(Exception):
    """A message that is dropped and counted, not a failure: it did not come from a live worker."""


@dataclass
class Request:
    """One ``collect`` request to a worker (lockstep collectors): which batch its answer is a part of."""

    number: int  # the lockstep batch (numbered by the collector from 1, the same for every worker)
    slot: int | None = None  # the shared segment it names (a successor is asked again into the same rows)
    ahead: bool = False  # made before the caller asked for that batch (see Lockstep: such a part may be stale)

    def fields(self) -> dict[str, Any]:
        """The ``collect`` message's fields."""
        return {"n": self.number} if self.slot is None else {"n": self.number, "slot": self.slot}


@dataclass
class Received:
    """One batch as received: its header and data (views into a slot, or over message frames)."""

    worker: int
    generation: int
    header: dict[str, Any]
    data: TensorDictBase
    in_slot: bool
    nbytes: int = 0  # the batch's tensor bytes (as the worker's hello layout says)
    request: Request | None = None  # the ``collect`` it answers (lockstep collectors)


@dataclass
class Orders:
    """What every worker is under, set by the collector's dispatch strategy and told again at each hello."""

    paused: bool = False
    running: bool = False  # ``run`` was sent (asynchronous collectors): workers collect on their credits


@dataclass
class Retired:
    """An incarnation that died, so each of its batches that arrives late is counted as dropped once."""

    generation: int
    next_seq: int  # its first batch neither received nor counted yet
    counted_seq: int | None  # the batch it was collecting at its last heartbeat: counted at its death


@dataclass
class WorkerHandle:
    """What the collector knows about one worker."""

    index: int
    config: P.WorkerConfig
    process: LaunchedWorker | None = None  # from the pool's launcher
    generation: int = 0
    ready: bool = False
    stopping: bool = False
    started_at: float = 0.0
    n_envs: int = 0
    frames_per_batch: int = 0
    layout: dict[str, Any] | None = None
    batch_nbytes: int = 0  # tensor bytes of one of its batches (from its layout)
    ring: ShmSlotRing | None = None
    retired_rings: list[ShmSlotRing] = field(default_factory=list)
    inbox: deque[Received] = field(default_factory=deque)
    requests: deque[Request] = field(default_factory=deque)  # ``collect`` requests not answered yet, in order
    changes_sent: int = 0  # P.BOUNDARY messages sent to this incarnation
    resets_sent: int = 0  # P.RESETS messages sent to this incarnation (its batches count those they began after)
    acked_version: int = 0
    last_beat: float = 0.0
    last_steps: int = -1
    last_progress: float = 0.0
    busy: bool = False  # stepping a batch (per its last heartbeat): a hung env shows as busy with no steps
    partial: bool = False  # a batch begun and not sent (stepping, or held by a pause): lost if it dies
    discarded_frames: int = 0  # frames this incarnation stepped and gave up, per its last heartbeat
    traj_counter: int = 0
    frames: int = 0
    restarts: int = 0
    next_seq: int = 0  # sequence number of the next batch this incarnation sends
    missing_since: float | None = None  # when a heartbeat first said a batch was sent that has not arrived
    sent: int = 0  # batches this incarnation had sent, per its last heartbeat
    retired: Retired | None = None  # its previous incarnation, while its late batches may still arrive
    joined: bool = False  # a worker started by hand took this slot (``config.remote``)
    weights_structure: WeightStructure | None = None  # its policy's weights, from hello (None: unknown)
    weights_refused: tuple[int, str] | None = None  # (version, why) of the last push it refused
    unreachable_since: float | None = None  # a send to it failed: its connection is gone (it died, or dies)

    def new_incarnation(self, now: float) -> None:
        """Forgets what the collector knew of the previous process in this slot: a new one takes it."""
        self.generation += 1
        self.ready = False
        self.acked_version = 0
        self.changes_sent, self.resets_sent = 0, 0
        for request in self.requests:  # asked again of the successor, which begins them after every change
            request.ahead = False
        self.last_steps, self.busy, self.partial, self.discarded_frames = -1, False, False, 0
        self.next_seq, self.missing_since, self.sent = 0, None, 0
        self.unreachable_since = None
        self.started_at = now

    @property
    def outstanding(self) -> int:
        """``collect`` requests not answered yet."""
        return len(self.requests)

    @property
    def identity(self) -> bytes:
        return P.worker_identity(self.index, self.generation)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def where(self) -> str:
        """How messages name this worker's process: ``"pid 123"``, ``"Ray actor 1f2e..."``..."""
        return self.process.describe() if self.process is not None else f"pid {self.pid}"
