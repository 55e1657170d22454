"""The shared memory one worker slot owns on the collector's side: the slots its batches are written into, its pipe.

A :class:`WorkerMemory` is a part of a :class:`~acollect._workers.handles.WorkerHandle`. Its ring of shared-memory
slots (:class:`~acollect._batches.slot_ring.ShmSlotRing`) is replaced when a restarted worker says hello, and the
rings of its predecessors stay mapped for their batches still queued, until the pool closes (:meth:`release`). Its
pipe (:mod:`acollect._batches.slot_ring`) belongs to one incarnation: the collector names its path at the launch,
opens it once the hello says the worker made it there, and removes it when the incarnation is over.

Examples:
    >>> memory = WorkerMemory()
    >>> memory.make_credit_pipe("/tmp/acollect-doc-pipe-never-made")
    >>> memory.pipe_path is None  # not until its hello says it made it there
    True
    >>> memory.on_hello(pipe="/tmp/acollect-doc-pipe-never-made")
    >>> memory.pipe_path
    '/tmp/acollect-doc-pipe-never-made'
    >>> memory.release()
    >>> memory.pipe_path, memory.ring
    (None, None)
"""

from __future__ import annotations

from acollect._batches.slot_ring import CreditPipeWriter, ShmSlotRing, remove_credit_pipe

__all__ = ["WorkerMemory"]


class WorkerMemory:
    """One worker slot's rings of shared-memory slots (its incarnation's and its predecessors') and its pipe."""

    __slots__ = ("_pipe", "_pipe_made", "_pipe_path", "_retired_rings", "_ring")

    def __init__(self) -> None:
        # Where its batches are written (same host), and its predecessors' rings, still read by batches queued.
        self._ring: ShmSlotRing | None = None
        self._retired_rings: list[ShmSlotRing] = []
        # Its pipe: where this incarnation makes it, whether its hello said it did, and this end of it once opened.
        self._pipe_path: str | None = None
        self._pipe_made = False
        self._pipe: CreditPipeWriter | None = None

    @property
    def ring(self) -> ShmSlotRing | None:
        """The shared-memory slots its batches are written into (``None``: batches come as frames)."""
        return self._ring

    @property
    def pipe_path(self) -> str | None:
        """Where its pipe is, once its hello said it made it there (``None``: it has none)."""
        return self._pipe_path if self._pipe_made else None

    @property
    def pipe(self) -> CreditPipeWriter | None:
        """This incarnation's pipe, open (``None``: its credits go as messages)."""
        return self._pipe

    def make_credit_pipe(self, path: str | None) -> None:
        """This incarnation (being launched) makes its pipe at ``path`` (``None``: none)."""
        self.drop_credit_pipe()
        self._pipe_path = path

    def on_hello(self, pipe: object) -> None:
        """It said hello, saying it made its pipe at ``pipe``; a restarted worker gets fresh slots."""
        # Opened only where this collector named it: a worker never makes it open another path.
        self._pipe_made = self._pipe_path is not None and pipe == self._pipe_path
        if self._ring is not None:
            # A restarted worker gets fresh slots: batches still queued from its predecessor keep theirs.
            self._retired_rings.append(self._ring)
            self._ring = None

    def use_ring(self, ring: ShmSlotRing) -> None:
        """Its batches are written into ``ring`` (told to the worker with the ``slots`` message)."""
        self._ring = ring

    def use_credit_pipe(self, pipe: CreditPipeWriter) -> None:
        """Its credits and the slots given back go down ``pipe`` (opened at its hello) from now on."""
        self._pipe = pipe

    def drop_credit_pipe(self) -> None:
        """This incarnation is over: its pipe is closed, and removed if its worker left it behind."""
        pipe, path = self._pipe, self._pipe_path
        self._pipe, self._pipe_path, self._pipe_made = None, None, False
        if pipe is not None:
            pipe.close()
        if path is not None:
            remove_credit_pipe(path)

    def release(self) -> None:
        """The pool closed: unmaps and removes its slots, and its pipe. Idempotent."""
        for ring in [*self._retired_rings, *([self._ring] if self._ring is not None else [])]:
            ring.close()
            ring.unlink()
        self._ring, self._retired_rings = None, []
        self.drop_credit_pipe()
