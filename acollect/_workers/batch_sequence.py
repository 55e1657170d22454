"""One worker's batches in order: each checked against the next sequence number, the missing and the late counted.

A :class:`BatchSequence` is a part of a :class:`~acollect._workers.handles.WorkerHandle`. Batches travel on another
connection than heartbeats, so a heartbeat may say a batch was sent before it arrives; one still missing a
``heartbeat_timeout`` later was lost, which the liveness loop reads from :attr:`~BatchSequence.missing_since`. When an
incarnation dies, its batches that still arrive are dropped (its successor reuses their trajectory ids), each counted
once (:meth:`~BatchSequence.on_late`). It also keeps the counters of the last batch, which a successor starts from.

Examples:
    >>> batches = BatchSequence(0)
    >>> batches.on_sent(1, now=5.0)  # a heartbeat says one was sent: it is missing until it comes
    >>> batches.missing_since
    5.0
    >>> batches.check({"seq": 0})
    >>> batches.on_batch({"seq": 0, "traj_counter": 4, "frames": 16})
    >>> batches.next_seq, batches.missing_since, batches.traj_counter, batches.frames
    (1, None, 4, 16)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from acollect._workers import protocol as P
from acollect.errors import ProtocolError

__all__ = ["BatchSequence"]


@dataclass(frozen=True)
class _Retired:
    """An incarnation that died, so each of its batches that arrives late is counted as dropped once."""

    generation: int
    next_seq: int  # its first batch neither received nor counted yet
    counted_seq: int | None  # the batch it was collecting at its last heartbeat: counted at its death


class BatchSequence:
    """The batches of one worker slot's incarnation, in order; its dead predecessor's, counted as they come late.

    Args:
        worker: the worker's index (its errors name it).
    """

    __slots__ = ("_frames", "_missing_since", "_next_seq", "_retired", "_sent", "_traj_counter", "_worker")

    def __init__(self, worker: int) -> None:
        self._worker = worker
        self._sent = 0
        self._next_seq = 0
        self._missing_since: float | None = None
        self._retired: _Retired | None = None
        # Its counters (the last batch's), which a successor starts from.
        self._traj_counter = 0
        self._frames = 0

    @property
    def sent(self) -> int:
        """Batches this incarnation had sent, per its last heartbeat."""
        return self._sent

    @property
    def next_seq(self) -> int:
        """The sequence number of the next batch this incarnation sends."""
        return self._next_seq

    @property
    def missing_since(self) -> float | None:
        """When a heartbeat first said a batch was sent that has not arrived (``None``: none is missing)."""
        return self._missing_since

    @property
    def traj_counter(self) -> int:
        """Its next trajectory id counter, as of its last batch (a successor starts from it)."""
        return self._traj_counter

    @property
    def frames(self) -> int:
        """Frames it collected, as of its last batch (a successor starts from it)."""
        return self._frames

    def restore_counters(self, traj_counter: int, frames: int) -> None:
        """Counters restored from a collector state dict (sent to it, and to any successor with its config)."""
        self._traj_counter, self._frames = traj_counter, frames

    def on_new_incarnation(self) -> None:
        """A new process takes the slot: its batches are numbered from 0 (the counters carry over)."""
        self._next_seq, self._missing_since, self._sent = 0, None, 0

    def on_sent(self, sent: int, now: float) -> None:
        """A heartbeat says ``sent`` batches were sent so far."""
        self._sent = sent
        # Batches travel on another connection than heartbeats, so one may be overtaken; a batch still
        # missing a heartbeat_timeout later was lost (a dropped connection loses what it held).
        if self._sent <= self._next_seq:
            self._missing_since = None
        elif self._missing_since is None:
            self._missing_since = now

    def check(self, header: dict[str, Any]) -> None:
        """Checks that a batch is the next one (:meth:`on_batch` takes it once the rest of it is checked too).

        Raises:
            Rejected: a replayed batch (dropped and counted, not a failure).
            ProtocolError: a batch out of order, or with no sequence number.
        """
        seq = header.get("seq")
        if type(seq) is not int:
            raise ProtocolError(f"worker {self._worker} sent a batch with seq={seq!r:.20}, expected an int")
        if seq < self._next_seq:
            raise P.Rejected(f"replayed batch: seq {seq} from worker {self._worker}, expected {self._next_seq}")
        if seq > self._next_seq:
            raise ProtocolError(f"worker {self._worker} sent batch {seq} after {self._next_seq - 1}: batches lost")

    def on_batch(self, header: dict[str, Any]) -> None:
        """The batch :meth:`check` passed arrived: the next one is awaited, and its counters are the last."""
        self._next_seq += 1
        self._missing_since = None
        self._traj_counter = int(header["traj_counter"])
        self._frames = int(header["frames"])

    def retire(self, generation: int | None, *, in_progress: bool) -> None:
        """The incarnation ``generation`` died: each of its batches that arrives after this is counted as dropped as
        it comes (:meth:`on_late`), except the one in progress at its last heartbeat (``in_progress``), counted
        with its death. ``None``: none is (a lockstep worker's are counted with its requests)."""
        if generation is None:
            self._retired = None
        else:
            self._retired = _Retired(generation, self._next_seq, self._sent if in_progress else None)

    def on_late(self, generation: int, header: dict[str, Any]) -> bool:
        """A message of a dead incarnation arrived: whether it is a batch to count as dropped (once)."""
        retired = self._retired
        if retired is None or retired.generation != generation:
            return False  # lockstep (counted with its request), or an older incarnation
        seq = header.get("seq")
        if header["kind"] != P.BATCH or type(seq) is not int or seq < retired.next_seq:
            return False  # not a batch, or one received or counted already (a replay)
        self._retired = _Retired(retired.generation, seq + 1, retired.counted_seq)
        return seq != retired.counted_seq
