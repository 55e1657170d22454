"""The shared memory one worker slot owns on the collector's side: the slots its batches are written into, its doorbell.

A :class:`WorkerMemory` is a part of a :class:`~acollect._workers.handles.WorkerHandle`. Its ring of shared-memory
slots (:class:`~acollect._batches.slot_ring.ShmSlotRing`) is replaced when a restarted worker says hello, and the
rings of its predecessors stay mapped for their batches still queued, until the pool closes (:meth:`release`). Its
doorbell (:mod:`acollect._batches.doorbell`) belongs to one incarnation: the collector names its path at the launch,
opens it once the hello says the worker made it there, and removes it when the incarnation is over.

Examples:
    >>> memory = WorkerMemory()
    >>> memory.make_doorbell("/tmp/acollect-doc-bell-never-made")
    >>> memory.bell_path is None  # not until its hello says it made it there
    True
    >>> memory.on_hello(doorbell="/tmp/acollect-doc-bell-never-made")
    >>> memory.bell_path
    '/tmp/acollect-doc-bell-never-made'
    >>> memory.release()
    >>> memory.bell_path, memory.ring
    (None, None)
"""

from __future__ import annotations

from acollect._batches.doorbell import DoorbellWriter, remove_doorbell
from acollect._batches.slot_ring import ShmSlotRing

__all__ = ["WorkerMemory"]


class WorkerMemory:
    """One worker slot's rings of shared-memory slots (its incarnation's and its predecessors') and its doorbell."""

    __slots__ = ("_bell_made", "_bell_path", "_doorbell", "_retired_rings", "_ring")

    def __init__(self) -> None:
        # Where its batches are written (same host), and its predecessors' rings, still read by batches queued.
        self._ring: ShmSlotRing | None = None
        self._retired_rings: list[ShmSlotRing] = []
        # Its doorbell: where this incarnation makes it, whether its hello said it did, and this end of it once opened.
        self._bell_path: str | None = None
        self._bell_made = False
        self._doorbell: DoorbellWriter | None = None

    @property
    def ring(self) -> ShmSlotRing | None:
        """The shared-memory slots its batches are written into (``None``: batches come as frames)."""
        return self._ring

    @property
    def bell_path(self) -> str | None:
        """Where its doorbell is, once its hello said it made it there (``None``: it has none)."""
        return self._bell_path if self._bell_made else None

    @property
    def doorbell(self) -> DoorbellWriter | None:
        """This incarnation's doorbell, open (``None``: its credits go as messages)."""
        return self._doorbell

    def make_doorbell(self, path: str | None) -> None:
        """This incarnation (being launched) makes its doorbell at ``path`` (``None``: none)."""
        self.drop_doorbell()
        self._bell_path = path

    def on_hello(self, doorbell: object) -> None:
        """It said hello, saying it made its doorbell at ``doorbell``; a restarted worker gets fresh slots."""
        # Opened only where this collector named it: a worker never makes it open another path.
        self._bell_made = self._bell_path is not None and doorbell == self._bell_path
        if self._ring is not None:
            # A restarted worker gets fresh slots: batches still queued from its predecessor keep theirs.
            self._retired_rings.append(self._ring)
            self._ring = None

    def use_ring(self, ring: ShmSlotRing) -> None:
        """Its batches are written into ``ring`` (told to the worker with the ``slots`` message)."""
        self._ring = ring

    def use_doorbell(self, doorbell: DoorbellWriter) -> None:
        """Its credits and the slots given back go down ``doorbell`` (opened at its hello) from now on."""
        self._doorbell = doorbell

    def drop_doorbell(self) -> None:
        """This incarnation is over: its doorbell is closed, and removed if its worker left it behind."""
        bell, path = self._doorbell, self._bell_path
        self._doorbell, self._bell_path, self._bell_made = None, None, False
        if bell is not None:
            bell.close()
        if path is not None:
            remove_doorbell(path)

    def release(self) -> None:
        """The pool closed: unmaps and removes its slots, and its doorbell. Idempotent."""
        for ring in [*self._retired_rings, *([self._ring] if self._ring is not None else [])]:
            ring.close()
            ring.unlink()
        self._ring, self._retired_rings = None, []
        self.drop_doorbell()
