"""Shared-memory slots: large same-host payloads without a copy through a socket.

A segment is a file under ``/dev/shm`` named ``acollect-<owner pid>-<random>``,
mapped with :mod:`mmap` and seen as torch tensors. The process that creates a
segment owns it and is the only one that unlinks it; other processes attach by
name. :mod:`multiprocessing.shared_memory` is not used on purpose: its resource
tracker unlinks segments that child processes merely attached to, and warns.

If the owner dies without unlinking, the file stays until :func:`cleanup_stale`
removes segments whose owner pid is gone. Mappings outlive the unlink: memory is
freed when the last process unmaps it.

Where ``/dev/shm`` does not exist (:func:`shm_available` is ``False``), callers
send the tensors as message frames instead. One worker's ring of slots is
:class:`~acollect._batches.slot_ring.ShmSlotRing`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase

from acollect._runtime.layout import LeafLayout, aligned_offsets, build_tensordict, part_of, validate_layout
from acollect.errors import ConfigurationError, TransportError

__all__ = ["SHM_DIR", "SHM_PREFIX", "ShmSegment", "ShmTensorDictSlot", "cleanup_stale", "shm_available"]

#: Where segments live (a tmpfs on Linux).
SHM_DIR = "/dev/shm"
#: Every segment name starts with this, then ``<owner pid>-<random hex>``.
SHM_PREFIX = "acollect-"
_NAME = re.compile(r"acollect-(\d+)-[0-9a-f]{16}")


def shm_available() -> bool:
    """Whether shared-memory segments can be created here (Linux ``/dev/shm``)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK)


def _unlink_if_owner(path: str, owner_pid: int) -> None:
    # Runs from a finalizer, possibly at interpreter exit; a forked child that
    # inherited the finalizer must not remove its parent's segment.
    if os.getpid() == owner_pid:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class ShmSegment:
    """One named shared-memory segment mapped into this process.

    Use :meth:`create` (owner) or :meth:`attach` (any other process). Closing
    unmaps the segment once no tensor over it is alive; only the owner unlinks it,
    and an owner that is garbage collected or exits unlinks it too.

    Examples:
        >>> with ShmSegment.create(16) as owner:
        ...     owner.tensor()[:] = 7
        ...     with ShmSegment.attach(owner.name, 16) as other:
        ...         int(other.tensor().sum())
        112
    """

    #: the segments mapped in this process whose memory is seen as a tensor, by the address it starts at
    _mapped: ClassVar[weakref.WeakValueDictionary[int, ShmSegment]] = weakref.WeakValueDictionary()
    # Segments are mapped and closed from several threads (a thread-mode inference server's slot hub, the event
    # loop's hand-out asking what holds an address): every access to the map holds this.
    _mapped_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, size: int, mapping: mmap.mmap, *, owner: bool) -> None:
        self._before_unmap: list[Callable[[ShmSegment], None]] = []
        self._name = name
        self._size = size
        self._mapping: mmap.mmap | None = mapping
        self._owner = owner
        self._tensor: torch.Tensor | None = None
        # The owner's name is unlinked by this finalizer, at garbage collection or exit, unless unlink() did it
        # first (and detached it): whether the name is still there is whether the finalizer is alive.
        self._finalizer = weakref.finalize(self, _unlink_if_owner, self.path, os.getpid()) if owner else None

    @classmethod
    def create(cls, size: int) -> ShmSegment:
        """Creates a new segment of ``size`` bytes owned by this process."""
        if type(size) is not int or size < 0:
            raise ConfigurationError.bad_value("size", size, "an int >= 0 (bytes)")
        name = f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise TransportError(f"cannot create shared-memory segment {path}: {exc}") from exc
        try:
            os.ftruncate(fd, max(size, 1))  # mmap refuses empty mappings
            mapping = mmap.mmap(fd, max(size, 1))
        except OSError as exc:
            os.unlink(path)
            raise TransportError(f"cannot allocate {size} bytes of shared memory in {SHM_DIR}: {exc}") from exc
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=True)

    @classmethod
    def attach(cls, name: str, size: int) -> ShmSegment:
        """Maps an existing segment created by another process (or this one).

        Raises:
            ConfigurationError: ``name`` is not an acollect segment name.
            TransportError: the segment does not exist (its owner unlinked it or died
                and it was cleaned up) or is smaller than ``size``.
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigurationError.bad_value("name", name, f"a segment name '{SHM_PREFIX}<pid>-<16 hex digits>'")
        if type(size) is not int or size < 0:
            raise ConfigurationError.bad_value("size", size, "an int >= 0 (bytes)")
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError as exc:
            raise TransportError(
                f"shared-memory segment {name!r} does not exist: its owner unlinked it or is gone"
            ) from exc
        except OSError as exc:
            raise TransportError(f"cannot open shared-memory segment {name!r}: {exc}") from exc
        try:
            actual = os.fstat(fd).st_size
            if actual < max(size, 1):
                raise TransportError(f"shared-memory segment {name!r} has {actual} bytes, {size} were expected")
            mapping = mmap.mmap(fd, max(size, 1))
        except OSError as exc:
            raise TransportError(f"cannot map shared-memory segment {name!r}: {exc}") from exc
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=False)

    @property
    def name(self) -> str:
        """The segment's name (what another process passes to :meth:`attach`)."""
        return self._name

    @property
    def path(self) -> str:
        """The segment's file path."""
        return os.path.join(SHM_DIR, self._name)

    @property
    def size(self) -> int:
        """Usable size in bytes."""
        return self._size

    @property
    def owner(self) -> bool:
        """Whether this process created the segment (and must unlink it)."""
        return self._owner

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._mapping is None

    def _require_open(self) -> mmap.mmap:
        if self._mapping is None:
            raise TransportError(f"shared-memory segment {self._name!r} is closed")
        return self._mapping

    @property
    def buffer(self) -> memoryview:
        """A writable memoryview of the segment's ``size`` bytes."""
        return memoryview(self._require_open())[: self._size]

    def tensor(self) -> torch.Tensor:
        """The segment as a 1-D ``uint8`` tensor sharing its memory (cached)."""
        mapping = self._require_open()
        if self._tensor is None:
            if self._size:
                # Through a memoryview: torch keeps the object it was given alive but
                # not a buffer export, so only the memoryview's export stops
                # mmap.close() from unmapping memory a live tensor still points to.
                self._tensor = torch.frombuffer(memoryview(mapping), dtype=torch.uint8, count=self._size)
                with ShmSegment._mapped_lock:
                    ShmSegment._mapped[self._tensor.data_ptr()] = self
            else:
                self._tensor = torch.empty(0, dtype=torch.uint8)
        return self._tensor

    def close(self) -> None:
        """Unmaps the segment from this process (idempotent).

        Tensors over the segment that are still alive keep the mapping valid; it is
        unmapped when the last of them is garbage collected.
        """
        if self._tensor is not None and self._size:
            with ShmSegment._mapped_lock:
                ShmSegment._mapped.pop(self._tensor.data_ptr(), None)
        hooks, self._before_unmap = self._before_unmap, []
        for hook in hooks:  # e.g. a CUDA registration undone while the memory is still mapped
            hook(self)
        mapping, self._mapping, self._tensor = self._mapping, None, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views are alive: the mmap object unmaps itself when they die

    @property
    def address(self) -> int | None:
        """Where the segment's memory starts in this process, once seen as a tensor (``None`` before, or closed)."""
        return self._tensor.data_ptr() if self._tensor is not None and self._size else None

    @staticmethod
    def containing(address: int) -> ShmSegment | None:
        """The open segment of this process whose memory holds ``address`` (``None``: not shared memory of ours).

        Examples:
            >>> with ShmSegment.create(64) as seg:
            ...     ShmSegment.containing(seg.tensor()[8:].data_ptr()) is seg
            True
        """
        with ShmSegment._mapped_lock:
            mapped = list(ShmSegment._mapped.items())
        for start, segment in mapped:
            if start <= address < start + segment.size:
                return segment
        return None

    def before_unmap(self, hook: Callable[[ShmSegment], None]) -> None:
        """Calls ``hook(segment)`` in :meth:`close`, while the memory is still mapped (once; at most at close)."""
        self._require_open()
        self._before_unmap.append(hook)

    def unlink(self) -> None:
        """Removes the segment's name (owner only, idempotent); mappings stay valid.

        Raises:
            TransportError: this process is not the owner.
        """
        if not self._owner:
            raise TransportError(f"only the owner (pid {self._name.split('-')[1]}) may unlink segment {self._name!r}")
        if self._finalizer is not None and self._finalizer.detach() is not None:  # None: unlinked already
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> ShmSegment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"ShmSegment(name={self._name!r}, size={self._size}, owner={self._owner}, {state})"


class ShmTensorDictSlot:
    """A shared-memory segment holding every leaf of one TensorDict layout.

    The owner creates the slot from a layout (see
    :func:`~acollect._runtime.wire.encode_tensordict`); another process attaches
    with :attr:`name` and :attr:`layout`. Leaves sit at 64-byte aligned offsets.

    Examples:
        >>> from tensordict import TensorDict
        >>> from acollect._runtime.wire import encode_tensordict
        >>> td = TensorDict({"obs": torch.arange(6).view(2, 3)}, batch_size=[2])
        >>> with ShmTensorDictSlot.create(encode_tensordict(td)[0]) as slot:
        ...     slot.write(td)
        ...     with ShmTensorDictSlot.attach(slot.name, slot.layout) as other:
        ...         other.read()["obs"].sum().item()
        15
    """

    def __init__(self, segment: ShmSegment, layout: dict[str, Any], *, part: object = None) -> None:
        self._segment = segment
        self._layout = layout
        self._part = part
        spec = validate_layout(layout)
        self._leaves: tuple[LeafLayout, ...] = spec.leaves
        offsets, _ = aligned_offsets([leaf.nbytes for leaf in spec.leaves])
        flat = segment.tensor()
        self._views = [
            flat.narrow(0, off, leaf.nbytes).view(leaf.dtype).view(leaf.shape)
            if leaf.nbytes
            else torch.empty(leaf.shape, dtype=leaf.dtype)
            for leaf, off in zip(spec.leaves, offsets, strict=True)
        ]
        self._td: TensorDictBase | None = build_tensordict(spec, self._views)
        if part is not None:
            # One writer's rows of a batch several write (see combined_layout): views of views, so the
            # writers never touch each other's memory and the reader sees the whole batch in one piece.
            self._td = part_of(self._td, part)
            self._views = [self._td.get(leaf.key) for leaf in spec.leaves]
            self._leaves = tuple(
                LeafLayout(leaf.key, leaf.dtype, tuple(view.shape), view.numel() * view.element_size())
                for leaf, view in zip(spec.leaves, self._views, strict=True)
            )

    @staticmethod
    def nbytes_for(layout: dict[str, Any]) -> int:
        """Segment size needed for ``layout`` (leaves plus alignment padding)."""
        spec = validate_layout(layout)
        return aligned_offsets([leaf.nbytes for leaf in spec.leaves])[1]

    @classmethod
    def create(cls, layout: dict[str, Any]) -> ShmTensorDictSlot:
        """Creates (and owns) a slot for ``layout``."""
        segment = ShmSegment.create(cls.nbytes_for(layout))
        try:
            return cls(segment, layout)
        except BaseException:
            segment.close()
            segment.unlink()
            raise

    @classmethod
    def attach(cls, name: str, layout: dict[str, Any], *, part: object = None) -> ShmTensorDictSlot:
        """Attaches to a slot another process created (``part``: only this part of it, see :meth:`part_view`)."""
        segment = ShmSegment.attach(name, cls.nbytes_for(layout))
        try:
            return cls(segment, layout, part=part)
        except BaseException:
            segment.close()
            raise

    @property
    def name(self) -> str:
        """The segment name to send to the other process."""
        return self._segment.name

    @property
    def layout(self) -> dict[str, Any]:
        """The msgpack-able layout the slot was made for."""
        return self._layout

    @property
    def part(self) -> object:
        """Which part of the layout this slot is (see :func:`~acollect._runtime.layout.part_of`), or ``None``."""
        return self._part

    def part_view(self, part: object) -> ShmTensorDictSlot:
        """The same memory seen as one part of its layout: an index of its first dim, or rows ``[start, stop)``.

        The part shares this slot's segment: closing either closes both.
        """
        return type(self)(self._segment, self._layout, part=part)

    @property
    def segment(self) -> ShmSegment:
        """The underlying segment."""
        return self._segment

    @property
    def tensordict(self) -> TensorDictBase:
        """The slot itself as a TensorDict of views: fill it in place to skip a copy."""
        if self._td is None or self._segment.closed:
            raise TransportError(f"shared-memory slot {self.name!r} is closed")
        return self._td

    def write(self, td: TensorDictBase) -> None:
        """Copies ``td`` into the slot.

        Raises:
            ConfigurationError: ``td`` does not have exactly the slot's keys, dtypes and shapes.
        """
        if self._td is None or self._segment.closed:
            raise TransportError(f"shared-memory slot {self.name!r} is closed")
        self._check_matches(td, "td")
        for leaf, view in zip(self._leaves, self._views, strict=True):
            view.copy_(td.get(leaf.key))

    def _check_matches(self, td: TensorDictBase, name: str) -> None:
        keys = list(td.keys(include_nested=True, leaves_only=True))
        if len(keys) != len(self._leaves):
            raise ConfigurationError.bad_value(
                f"{name} keys", sorted(keys, key=str), f"exactly the slot's keys {[leaf.key for leaf in self._leaves]}"
            )
        for leaf in self._leaves:
            value = td.get(leaf.key, None)
            if not isinstance(value, torch.Tensor) or value.dtype != leaf.dtype or tuple(value.shape) != leaf.shape:
                got = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
                raise ConfigurationError.bad_value(f"{name}[{leaf.key!r}]", got, f"{leaf.dtype} {list(leaf.shape)}")

    def read(self, *, copy: bool = True, out: TensorDictBase | None = None) -> TensorDictBase:
        """The slot's content as a TensorDict.

        Args:
            copy: copy out of shared memory (default), so the slot can be written again
                at once. ``False`` returns the views themselves: valid only until the next write.
            out: copy into this TensorDict (same keys, dtypes and shapes, e.g. one worker's
                part of a preallocated batch) instead of fresh tensors, and return it.

        Raises:
            ConfigurationError: ``out`` does not match the slot's layout.
        """
        td = self.tensordict
        if out is not None:
            self._check_matches(out, "out")
            for leaf, view in zip(self._leaves, self._views, strict=True):
                out.get(leaf.key).copy_(view)
            return out
        return td.clone() if copy else td

    def close(self) -> None:
        """Unmaps the slot (idempotent); see :meth:`ShmSegment.close`."""
        self._views, self._td = [], None  # so the mapping can go once the caller's views die
        self._segment.close()

    def unlink(self) -> None:
        """Removes the slot's segment (owner only, idempotent)."""
        self._segment.unlink()

    def __enter__(self) -> ShmTensorDictSlot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._segment.__exit__(*exc_info)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def cleanup_stale(directory: str = SHM_DIR) -> list[str]:
    """Removes acollect segments whose owner process no longer exists.

    A recycled pid makes a stale segment look alive; it is then left alone.

    Returns:
        The names of the removed segments.
    """
    removed: list[str] = []
    entries = os.listdir(directory) if os.path.isdir(directory) else []
    for entry in entries:
        match = _NAME.fullmatch(entry)
        if match and not _pid_alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):  # another cleaner was faster
                os.unlink(os.path.join(directory, entry))
                removed.append(entry)
    return removed
