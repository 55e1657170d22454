"""Lockstep batches written in place: one shared-memory segment per batch in flight, each worker its own rows.

A lockstep batch is one part from every worker, stacked (``[n_workers, n_envs, T]``) or concatenated
along envs. Where the workers run on this host and their parts combine so, the pool makes
:class:`SharedBatches`: a ring of segments each holding a whole batch, in which every worker is told
its rows (an index of the first dim, or rows ``[start, stop)``). A worker's engine writes each step
straight into its rows, so the batch is ready for the trainer the moment the last part arrives: no
gather, and a lent batch is the segment itself.

The collector, not the workers, says which segment each batch goes into (``collect`` names it), since
every worker must write the same batch into the same one; a segment is free again once every part of
the batch it held was given back (every live worker's part, where a worker was lost: see :meth:`expect`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from acollect._batches.slot_ring import ShmSlotRing
from acollect._runtime.layout import combined_layout
from acollect.errors import ProtocolError

__all__ = ["SharedBatches"]


class SharedBatches:
    """``n_slots`` segments of one combined batch layout, each written by every worker in its own rows.

    Build it with :meth:`create`; the pool owns it and unlinks its segments at :meth:`close`.

    Args:
        ring: the segments (their free list is the collector's: :meth:`acquire`, :meth:`give_back`).
        parts: where each worker's rows lie (see :func:`~acollect._runtime.layout.combined_layout`).
        part_layouts: each worker's own batch layout, as its hello announced it.
    """

    def __init__(self, ring: ShmSlotRing, parts: Sequence[Any], part_layouts: Sequence[dict[str, Any]]) -> None:
        self.ring = ring
        self.parts = list(parts)
        self.part_layouts = list(part_layouts)
        self._given_back = [0] * len(ring)  # parts of each segment's batch given back so far
        self._expected = [len(self.parts)] * len(ring)  # parts each segment's batch holds (fewer after a loss)

    @classmethod
    def create(cls, layouts: Sequence[dict[str, Any]], *, stack: bool, n_slots: int) -> SharedBatches | None:
        """Segments for batches made of parts of these layouts, or ``None`` if the parts do not combine so."""
        combined = combined_layout(layouts, stack=stack)
        if combined is None:
            return None
        layout, parts = combined
        return cls(ShmSlotRing.create(layout, n_slots), parts, layouts)

    def fits(self, worker: int, layout: dict[str, Any] | None) -> bool:
        """Whether a worker announcing ``layout`` writes rows of the shape this ring gave ``worker``."""
        return layout == self.part_layouts[worker]

    def slots_message(self, worker: int) -> dict[str, Any]:
        """The fields of the ``slots`` message that tells ``worker`` its rows."""
        return {"names": self.ring.names, "layout": self.ring.layout, "part": self.parts[worker]}

    def part_ring(self, worker: int) -> ShmSlotRing:
        """``worker``'s rows of every segment (what its batches are read from)."""
        return self.ring.part_view(self.parts[worker])

    def acquire(self) -> int | None:
        """A free segment for the next batch (``None``: every one holds a batch not given back yet)."""
        return self.ring.acquire()

    def expect(self, slot: int, parts: int) -> None:
        """The batch in ``slot`` holds ``parts`` parts, all given back later (fewer than every worker's where a worker
        was lost: its rows were never written, or not taken)."""
        self._expected[slot] = parts

    def give_back(self, slot: int) -> None:
        """One part of the batch in ``slot`` was handed out (or copied) and given back; the last frees it."""
        self._given_back[slot] += 1
        if self._given_back[slot] >= self._expected[slot]:
            self._release(slot)

    def _release(self, slot: int) -> None:
        self._given_back[slot], self._expected[slot] = 0, len(self.parts)
        self.ring.release(slot)

    def give_back_whole(self, slot: int) -> None:
        """The batch in ``slot`` was lent whole and dropped: every part of it is given back at once."""
        self._release(slot)

    def grow(self, count: int) -> list[str]:
        """``count`` more segments, free (for batches lent to the caller); returns their names.

        Raises:
            TransportError: the shared memory could not be had: nothing was added.
        """
        names = self.ring.grow(count)
        self._given_back.extend([0] * count)
        self._expected.extend([len(self.parts)] * count)
        return names

    def batch(self, slot: int) -> TensorDictBase:
        """The whole batch in ``slot``: views of shared memory (valid while the segment is not given back)."""
        return self.ring[slot].tensordict

    def check_one_slot(self, slots: Mapping[int, object], expected: int) -> None:
        """Raises :class:`~acollect.errors.ProtocolError` unless every part of a batch (worker -> the slot its part
        names) is in slot ``expected``."""
        for worker, slot in slots.items():
            if slot != expected:
                raise ProtocolError(f"worker {worker} wrote its part into slot {slot!r:.20}, asked for slot {expected}")

    def close(self) -> None:
        """Unmaps and removes every segment (idempotent)."""
        self.ring.close()
        self.ring.unlink()

    def __len__(self) -> int:
        return len(self.ring)
