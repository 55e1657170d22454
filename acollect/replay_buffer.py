"""A fixed-capacity replay buffer of transitions, backed by one TensorDict.

Collectors hand out batches shaped ``[n_envs, T]`` (or ``[n_workers, n_envs, T]``);
:class:`ReplayBuffer` flattens every batch dim into single transitions and writes
them into preallocated storage, oldest first out once full. Storage is allocated
from the structure of the first batch (every key, nested ones included), so the
buffer needs no spec up front.

The buffer is safe to share between a collector writing from its event loop (or
a thread) and a trainer sampling from another thread: one lock guards each
``extend`` and ``sample``, and is held only for the copy in or out.
:meth:`ReplayBuffer.aextend` writes a batch in slices with a checkpoint between
them, so that a large batch never holds the event loop for the whole copy (what
background mode uses); a sample taken between two slices sees whole transitions
only, old or new.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ConfigurationError, EmptyBufferError

__all__ = ["EmptyBufferError", "ReplayBuffer", "SupportsExtend", "extend_from_loop"]

NestedKey = str | tuple[str, ...]

#: At most this many bytes of transitions per slice of :meth:`ReplayBuffer.aextend`: about 0.1-0.3 ms of
#: copying, so that pixel batches (tens of KiB per transition) are cut finer than ``slice_frames`` says.
_SLICE_BYTES = 1 << 20


def _key_name(key: NestedKey) -> str:
    return ".".join(key) if isinstance(key, tuple) else key


class ReplayBuffer:
    """Circular storage of transitions with uniform sampling.

    Args:
        capacity: the most transitions held at once; older ones are overwritten first.
        device: where the storage lives. ``None``: the device of the first batch.

    Raises:
        ConfigurationError: ``capacity`` is not a positive int.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from acollect import ReplayBuffer
        >>> rb = ReplayBuffer(capacity=100)
        >>> batch = TensorDict(
        ...     {"observation": torch.randn(8, 16, 4), "next": {"reward": torch.ones(8, 16, 1)}},
        ...     batch_size=[8, 16],
        ... )
        >>> rb.extend(batch)  # 8 envs x 16 steps -> 128 transitions, the last 100 kept
        >>> len(rb)
        100
        >>> rb.sample(32)["next", "reward"].shape
        torch.Size([32, 1])
    """

    def __init__(self, capacity: int, *, device: torch.device | str | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ConfigurationError.bad_value("capacity", capacity, "a positive int")
        self._capacity = capacity
        self._device = torch.device(device) if device is not None else None
        self._lock = threading.Lock()
        self._storage: TensorDict | None = None
        # (key, storage leaf) pairs: extend writes straight into the leaves, skipping TensorDict dispatch.
        self._leaves: list[tuple[NestedKey, torch.Tensor]] = []
        self._cursor = 0
        self._size = 0

    @property
    def capacity(self) -> int:
        """The most transitions the buffer holds."""
        return self._capacity

    @property
    def device(self) -> torch.device | None:
        """Where the storage lives (``None`` until the first ``extend`` if no device was given)."""
        return self._device

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        keys = [_key_name(k) for k, _ in self._leaves]
        return f"ReplayBuffer(capacity={self._capacity}, len={self._size}, device={self._device}, keys={keys})"

    def extend(self, batch: TensorDictBase) -> None:
        """Adds every transition of ``batch``, overwriting the oldest once full.

        All batch dims are flattened: a ``[n_envs, T]`` batch adds ``n_envs * T``
        transitions in row-major order (env 0's steps first). Dim names such as
        ``"time"`` are dropped. A batch larger than the capacity keeps its last
        ``capacity`` transitions.

        Args:
            batch: a TensorDict with at least one tensor leaf. Every later batch
                must have the same keys and per-transition shapes as the first.

        Raises:
            ConfigurationError: ``batch`` is not a TensorDict, holds non-tensor
                leaves, or its keys or shapes differ from the first batch's.
        """
        leaves, n = self._flatten(batch)
        with self._lock:
            self._fit(leaves, batch)
            if n:
                self._write(leaves, max(0, n - self._capacity), n)

    async def aextend(self, batch: TensorDictBase, *, slice_frames: int = 512) -> None:
        """:meth:`extend`, in slices with a checkpoint between them, so the event loop runs other tasks meanwhile.

        Writing a batch holds whoever writes for as long as the copy takes (milliseconds for a few thousand
        transitions on a slow machine, far more for pixels); on an event loop, every other task waits that
        long. Here the batch is checked, then written in slices of at most ``slice_frames`` transitions (and
        at most about 1 MiB), with a checkpoint between two (none before the first: it follows the caller's
        own work of this turn of the loop, and beside a trainer that computes between its awaits every turn
        costs the caller a trainer step: a batch of one slice goes in without one). Each slice is written under
        the lock, and the length grows only once a slice's rows are written in every leaf: a sample taken
        between two slices (from this loop or another thread) sees whole transitions only, each either old or
        new. The transitions end up where :meth:`extend` would put them.

        The write is shielded from cancellation: a cancelled call still writes the whole batch (a batch is
        never half in the buffer), then raises the cancellation. Two writers at once each write whole
        transitions, but their slices may interleave.

        Args:
            batch: as for :meth:`extend`.
            slice_frames: the most transitions written between two checkpoints.

        Raises:
            ConfigurationError: as for :meth:`extend`, or ``slice_frames`` is not a positive int.

        Examples:
            >>> import anyio, torch
            >>> from tensordict import TensorDict
            >>> from acollect import ReplayBuffer
            >>> rb = ReplayBuffer(capacity=1000)
            >>> batch = TensorDict({"observation": torch.randn(8, 64, 4)}, batch_size=[8, 64])
            >>> anyio.run(lambda: rb.aextend(batch, slice_frames=128))  # 4 slices of 128 transitions
            >>> len(rb)
            512
        """
        if isinstance(slice_frames, bool) or not isinstance(slice_frames, int) or slice_frames <= 0:
            raise ConfigurationError.bad_value("slice_frames", slice_frames, "a positive int")
        leaves, n = self._flatten(batch)
        with self._lock:
            self._fit(leaves, batch)
            storage = self._storage
        if n == 0:
            return
        row_bytes = sum(leaf[:1].nbytes for leaf in leaves.values())
        step = max(1, min(slice_frames, _SLICE_BYTES // max(1, row_bytes)))
        start = max(0, n - self._capacity)
        # Shielded: a batch is written whole or not at all, as with extend(); a few milliseconds at most.
        with anyio.CancelScope(shield=True):
            for lo in range(start, n, step):
                if lo > start:  # the loop's other tasks run here, between two slices
                    await anyio.lowlevel.checkpoint()
                with self._lock:
                    if self._storage is not storage:  # load_state_dict() replaced it meanwhile: the rest may not fit
                        break
                    self._write(leaves, lo, min(n, lo + step))
        await anyio.lowlevel.checkpoint_if_cancelled()

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """Draws ``batch_size`` transitions uniformly, with replacement.

        Args:
            batch_size: how many transitions to draw.
            generator: a CPU ``torch.Generator`` for reproducible draws.

        Returns:
            A TensorDict of batch size ``[batch_size]`` (a copy: later writes do not change it).

        Raises:
            ConfigurationError: ``batch_size`` is not a positive int.
            EmptyBufferError: the buffer holds no transitions yet.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ConfigurationError.bad_value("batch_size", batch_size, "a positive int")
        with self._lock:
            if self._size == 0 or self._storage is None:
                raise EmptyBufferError("cannot sample from an empty ReplayBuffer: call extend() first")
            index = torch.randint(self._size, (batch_size,), generator=generator)
            if self._device is not None and self._device.type != "cpu":
                index = index.to(self._device)
            # index_select leaf by leaf rather than ``storage[index]``, whose indexing leaves ~10 objects of
            # cyclic garbage per call: a trainer sampling while a collector runs would bring on young-generation
            # collections many times a second, each pausing the event loop.
            sample = self._storage.apply(lambda leaf: leaf.index_select(0, index), batch_size=[batch_size])
            assert sample is not None  # apply returns None only with inplace=True
            return sample

    def clear(self) -> None:
        """Forgets every transition; the storage (and its key layout) is kept for reuse."""
        with self._lock:
            self._cursor = 0
            self._size = 0

    def state_dict(self) -> dict[str, Any]:
        """Returns the contents as plain dicts and tensors (``torch.save``-able, ``weights_only`` safe)."""
        with self._lock:
            storage = None
            if self._storage is not None:
                # Saved oldest-first, so it loads into a buffer of any large-enough capacity.
                order = (torch.arange(self._size) + self._cursor - self._size) % self._capacity
                storage = self._storage[order].to_dict()
            return {"capacity": self._capacity, "size": self._size, "storage": storage}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores contents saved by :meth:`state_dict`.

        Raises:
            ConfigurationError: the saved buffer holds more transitions than this one's capacity.
        """
        size = int(state_dict["size"])
        if size > self._capacity:
            raise ConfigurationError.bad_value(
                "state_dict['size']", size, f"at most this buffer's capacity ({self._capacity})"
            )
        saved = state_dict["storage"]
        with self._lock:
            self._storage = None
            self._leaves = []
            self._cursor = 0
            self._size = 0
        if saved is not None and size > 0:
            self.extend(TensorDict(saved, batch_size=[size]))

    def _flatten(self, batch: TensorDictBase) -> tuple[dict[NestedKey, torch.Tensor], int]:
        """The leaves of ``batch``, each flattened to ``[n, ...]``, and ``n``."""
        if not isinstance(batch, TensorDictBase):
            raise ConfigurationError.bad_value("batch", type(batch).__name__, "a TensorDict")
        n = math.prod(batch.batch_size)
        return self._flat_leaves(batch, n, batch.batch_dims), n

    def _fit(self, leaves: dict[NestedKey, torch.Tensor], batch: TensorDictBase) -> None:
        """Allocates the storage for the first batch, checks every later one against it (lock held)."""
        if self._storage is None:
            self._allocate(leaves, batch)
        else:
            self._check_structure(leaves)

    def _write(self, leaves: dict[NestedKey, torch.Tensor], lo: int, hi: int) -> None:
        """Writes rows ``lo:hi`` of every leaf at the cursor, then moves the cursor and the length (lock held).

        The rows are in every leaf before the length counts them: a sampler never draws a row that is not
        written yet. Once full, the rows overwritten are the oldest, each replaced whole under the lock.
        """
        count = hi - lo
        start = self._cursor
        first = min(count, self._capacity - start)
        for key, dest in self._leaves:
            src = leaves[key]
            dest[start : start + first].copy_(src[lo : lo + first])
            if first < count:
                dest[: count - first].copy_(src[lo + first : hi])
        self._cursor = (start + count) % self._capacity
        self._size = min(self._capacity, self._size + count)

    def _flat_leaves(self, batch: TensorDictBase, n: int, batch_dims: int) -> dict[NestedKey, torch.Tensor]:
        leaves: dict[NestedKey, torch.Tensor] = {}
        for key in batch.keys(include_nested=True, leaves_only=True):
            value = batch.get(key)
            if not isinstance(value, torch.Tensor):
                raise ConfigurationError.bad_value(
                    f"batch[{_key_name(key)!r}]", type(value).__name__, "a tensor (non-tensor data cannot be stored)"
                )
            # Plain reshape on the leaf: a view for contiguous collector batches, and no dim names to carry.
            leaves[key] = value.reshape(n, *value.shape[batch_dims:])
        if not leaves:
            raise ConfigurationError.bad_value("batch", "a TensorDict with no tensors", "at least one tensor leaf")
        return leaves

    def _allocate(self, leaves: dict[NestedKey, torch.Tensor], batch: TensorDictBase) -> None:
        if self._device is None:
            self._device = batch.device if batch.device is not None else next(iter(leaves.values())).device
        storage = TensorDict(batch_size=[self._capacity], device=self._device)
        for key, value in leaves.items():
            storage.set(key, torch.empty((self._capacity, *value.shape[1:]), dtype=value.dtype, device=self._device))
        self._storage = storage
        self._leaves = [(key, storage.get(key)) for key in leaves]

    def _check_structure(self, leaves: dict[NestedKey, torch.Tensor]) -> None:
        expected = {key for key, _ in self._leaves}
        if expected != leaves.keys():
            missing = sorted(_key_name(k) for k in expected - leaves.keys())
            extra = sorted(_key_name(k) for k in leaves.keys() - expected)
            raise ConfigurationError(
                f"batch keys differ from the buffer's (set by the first extend): missing {missing}, extra {extra}."
            )
        for key, dest in self._leaves:
            src = leaves[key]
            if src.dtype != dest.dtype:
                raise ConfigurationError.bad_value(
                    f"batch[{_key_name(key)!r}] dtype", src.dtype, f"{dest.dtype} as in the first batch"
                )
            if src.shape[1:] != dest.shape[1:]:
                raise ConfigurationError.bad_value(
                    f"batch[{_key_name(key)!r}] per-transition shape",
                    tuple(src.shape[1:]),
                    f"{tuple(dest.shape[1:])} as in the first batch",
                )


class SupportsExtend(Protocol):
    """Anything a background collector can fill: ``acollect.ReplayBuffer``, torchrl's ``ReplayBuffer``..."""

    def extend(self, data: TensorDictBase, /) -> Any:
        """Adds a batch of transitions."""


async def extend_from_loop(buffer: SupportsExtend, batch: TensorDictBase) -> None:
    """Hands ``batch`` to ``buffer`` from an event loop, holding the loop as briefly as the buffer allows.

    An :class:`ReplayBuffer` is written in slices (:meth:`ReplayBuffer.aextend`), the loop's other tasks
    running between them; another library's buffer gets one ``extend(batch)`` call, on the loop (slicing
    the batch would change what its samplers see).
    """
    if isinstance(buffer, ReplayBuffer):
        await buffer.aextend(batch)
    else:
        buffer.extend(batch)
