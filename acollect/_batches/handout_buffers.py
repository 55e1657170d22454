"""Memory for the batches a collector copies out and hands over: reused once the caller has dropped one.

A batch copied out of shared memory into freshly allocated memory costs more than the copy
itself: the kernel maps the new pages one at a time, as they are first written (a 28 MiB
pixel batch copies about six times slower into new memory than into memory written before).
:class:`HandOutBuffers` remembers the last few large batches it handed out, by their storages
only, and once the caller holds no tensor of one anymore (each storage is referenced from here
alone) it offers that memory again, already mapped, wrapped in new tensors. A batch the caller
still holds, or any tensor of it, or a view of one, is never written: the caller owns what it
was given for as long as it keeps it.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> buffers = HandOutBuffers(min_bytes=0)
    >>> batch = TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    >>> buffers.adopt(batch, key="w0")
    >>> buffers.take("w0") is None  # the caller still holds it
    True
    >>> del batch
    >>> buffers.take("w0")["x"].shape
    torch.Size([4])
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["HandOutBuffers"]

# How many tensors reference a storage (views included). Private torch API: without it (another torch)
# nothing is ever reused, and every batch is fresh memory as before.
_use_count: Any = getattr(torch._C, "_storage_Use_Count", None)


def _alias(td: TensorDictBase) -> TensorDictBase:
    # New tensor objects over the same memory: whatever the caller does to the metadata of the tensors it
    # was given (an in-place unsqueeze_, requires_grad_) never reaches the ones kept here, and the other way.
    return td.detach()


def _leaves(td: TensorDictBase) -> list[torch.Tensor]:
    return [t for t in td.values(include_nested=True, leaves_only=True) if isinstance(t, torch.Tensor)]


class _Entry:
    __slots__ = ("base", "key", "storages")

    def __init__(self, key: Hashable, base: TensorDictBase, storages: list[Any]) -> None:
        self.key = key
        self.base = base  # private aliases of the batch handed out
        self.storages = storages  # one per leaf: referenced here by ``base`` and by this list

    def free(self) -> bool:
        # 2: the alias in ``base`` and the storage object in ``storages``; anything more is the caller's.
        return all(_use_count(s._cdata) == 2 for s in self.storages)


class HandOutBuffers:
    """The memory of the last ``keep`` batches handed out (of ``min_bytes`` or more), for reuse once dropped.

    Not thread-safe: one caller at a time (a collector combines one batch at a time).

    Args:
        keep: how many dropped batches may be kept mapped for reuse (their memory stays allocated
            until the collector shuts down, or a newer batch takes their place).
        min_bytes: smaller batches are left alone: fresh memory of that size is mapped already.
    """

    def __init__(self, keep: int = 3, min_bytes: int = 1 << 20) -> None:
        self.keep = keep
        self.min_bytes = min_bytes
        self._entries: list[_Entry] = []

    def take(self, key: Hashable) -> TensorDictBase | None:
        """A batch of new tensors over the memory of a batch the caller dropped, made for ``key``; else ``None``.

        ``key`` names the layout of what will be copied in (say, which workers' batches, and their
        incarnations): memory made for another key is never offered.
        """
        for i, entry in enumerate(self._entries):
            if entry.key == key and entry.free():
                self._entries.append(self._entries.pop(i))  # the most recently handed out last
                return _alias(entry.base)
        return None

    def adopt(self, batch: TensorDictBase, key: Hashable) -> None:
        """Remembers the memory of ``batch`` (about to be handed out, made for ``key``) for reuse once dropped."""
        if _use_count is None:
            return
        leaves = _leaves(batch)
        if sum(t.numel() * t.element_size() for t in leaves) < self.min_bytes:
            return
        if any(t.device.type != "cpu" or not t.is_contiguous() or t.storage_offset() for t in leaves):
            return
        storages = [t.untyped_storage() for t in leaves]
        if len({s.data_ptr() for s in storages}) != len(storages):
            return  # leaves sharing a storage: their use counts would say nothing about the caller
        self._entries = [e for e in self._entries if e.key == key]  # another layout's memory is of no use now
        if len(self._entries) >= self.keep:
            self._entries.pop(0)  # still held by the caller (else it was taken): its memory is the caller's
        self._entries.append(_Entry(key, _alias(batch), storages))

    def forget(self, batch: TensorDictBase) -> None:
        """Stops tracking ``batch``'s memory (it was taken but not handed out, e.g. the copy into it failed)."""
        ptrs = {t.untyped_storage().data_ptr() for t in _leaves(batch)}
        self._entries = [e for e in self._entries if not ptrs & {s.data_ptr() for s in e.storages}]

    def clear(self) -> None:
        """Forgets every batch (their memory goes once the caller drops them)."""
        self._entries = []

    def __len__(self) -> int:
        return len(self._entries)
