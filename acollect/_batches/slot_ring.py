"""Rings of shared-memory slots: one worker's slots for one layout, and the credits they are.

A collector creates a :class:`ShmSlotRing` per worker and the worker attaches to it
by name; the slots themselves are :class:`~acollect._batches.shm.ShmTensorDictSlot`.
This module's one job is the ring's bookkeeping: which slots are free (a writer may
fill one) and which hold a batch the reader has not copied out yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from acollect._batches.shm import ShmTensorDictSlot
from acollect.errors import ConfigurationError

__all__ = ["ShmSlotRing"]


class ShmSlotRing:
    """``n_slots`` slots of one layout for one worker; the slot count is its credit count.

    The owner (collector) creates the ring and sends :attr:`names` and
    :attr:`layout` to the worker, which attaches. :meth:`acquire` and
    :meth:`release` track which slots are free on either side: the writer
    acquires a slot, fills it and names it in a message; the slot is released when
    the reader says it has copied it out.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from acollect._runtime.wire import encode_tensordict
        >>> layout, _ = encode_tensordict(TensorDict({"x": torch.zeros(4)}, batch_size=[4]))
        >>> with ShmSlotRing.create(layout, 2) as ring:
        ...     i = ring.acquire(); j = ring.acquire()
        ...     (i, j, ring.acquire(), ring.n_free)
        (0, 1, None, 0)
    """

    def __init__(self, slots: Sequence[ShmTensorDictSlot]) -> None:
        self._slots = tuple(slots)
        self._free: deque[int] = deque(range(len(self._slots)))

    @classmethod
    def create(cls, layout: dict[str, Any], n_slots: int) -> ShmSlotRing:
        """Creates (and owns) ``n_slots`` slots for ``layout``."""
        if type(n_slots) is not int or n_slots < 1:
            raise ConfigurationError.bad_value("n_slots", n_slots, "an int >= 1")
        slots: list[ShmTensorDictSlot] = []
        try:
            slots.extend(ShmTensorDictSlot.create(layout) for _ in range(n_slots))
        except BaseException:
            for slot in slots:
                slot.close()
                slot.unlink()
            raise
        return cls(slots)

    @classmethod
    def attach(cls, names: Sequence[str], layout: dict[str, Any], *, part: object = None) -> ShmSlotRing:
        """Attaches to every slot of a ring another process created (``part``: only that part of each slot)."""
        if isinstance(names, str) or not names:
            raise ConfigurationError.bad_value("names", names, "a non-empty list of segment names")
        slots: list[ShmTensorDictSlot] = []
        try:
            slots.extend(ShmTensorDictSlot.attach(name, layout, part=part) for name in names)
        except BaseException:
            for slot in slots:
                slot.close()
            raise
        return cls(slots)

    def grow(self, count: int) -> list[str]:
        """Creates (and owns) ``count`` more slots of this ring's layout, free; returns their names.

        Raises:
            TransportError: the shared memory could not be had (``/dev/shm`` full): nothing was added.
        """
        added: list[ShmTensorDictSlot] = []
        try:
            added.extend(ShmTensorDictSlot.create(self.layout) for _ in range(count))
        except BaseException:
            for slot in added:
                slot.close()
                slot.unlink()
            raise
        return self.extend(added)

    def attach_more(self, names: Sequence[str], *, part: object = None) -> None:
        """Attaches to more slots the owner added (see :meth:`grow`), free."""
        layout = self.layout
        self.extend([ShmTensorDictSlot.attach(name, layout, part=part) for name in names])

    def extend(self, slots: Sequence[ShmTensorDictSlot]) -> list[str]:
        """Adds ``slots`` (of this ring's layout) at the end, free; returns their names."""
        first = len(self._slots)
        self._slots = (*self._slots, *slots)
        self._free.extend(range(first, len(self._slots)))
        return [slot.name for slot in slots]

    def part_view(self, part: object) -> ShmSlotRing:
        """A ring over the same segments, each slot seen as that one part (see :meth:`ShmTensorDictSlot.part_view`)."""
        return type(self)([slot.part_view(part) for slot in self._slots])

    @property
    def names(self) -> list[str]:
        """The segment names, in slot order."""
        return [slot.name for slot in self._slots]

    @property
    def layout(self) -> dict[str, Any]:
        """The layout every slot holds."""
        return self._slots[0].layout

    @property
    def n_free(self) -> int:
        """How many slots are free (credits left)."""
        return len(self._free)

    def acquire(self) -> int | None:
        """Takes the oldest free slot's index, or ``None`` if every slot is in use."""
        return self._free.popleft() if self._free else None

    def release(self, index: int) -> None:
        """Gives slot ``index`` back.

        Raises:
            ConfigurationError: ``index`` is not a slot in use.
        """
        if type(index) is not int or not 0 <= index < len(self._slots) or index in self._free:
            raise ConfigurationError.bad_value("index", index, f"the index of a slot in use in [0, {len(self._slots)})")
        self._free.append(index)

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, index: int) -> ShmTensorDictSlot:
        return self._slots[index]

    def __iter__(self) -> Iterator[ShmTensorDictSlot]:
        return iter(self._slots)

    def close(self) -> None:
        """Unmaps every slot (idempotent)."""
        for slot in self._slots:
            slot.close()

    def unlink(self) -> None:
        """Removes every slot's segment (owner only, idempotent)."""
        for slot in self._slots:
            slot.unlink()

    def __enter__(self) -> ShmSlotRing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for slot in self._slots:
            slot.__exit__(*exc_info)
