"""One worker's flow control: the ring of shared-memory slots it writes its batches into, and the pipe its collector
gives them back by.

**The ring.** A collector creates a :class:`ShmSlotRing` per worker and the worker attaches to it by name; the slots
themselves are :class:`~acollect._batches.shm.ShmTensorDictSlot`. The ring keeps which slots are free (a writer may
fill one) and which hold a batch the reader has not given back yet: its slot count is the worker's credit count.

**The pipe.** Each batch a first-ready worker sends costs its collector one word back: a credit, often with the slot
of a batch the trainer dropped. As a ZeroMQ message that word wakes four threads (the collector's I/O thread, the
worker's, its control thread, then its runner) and costs the trainer's event loop tens of microseconds of CPU, on a
machine whose cores the envs need. The runner reads it only at its next batch boundary anyway.

A pipe is a named pipe (a FIFO) the worker makes, where its collector said (:func:`credit_pipe_path`), and reads; the
collector, on the same host, opens it for writing at the worker's hello and writes each word as one fixed-size record:
a ``write`` system call, which wakes nobody while the runner collects and wakes the runner itself when it waits. The
worker's control thread rings the same pipe (:meth:`CreditPipe.wake`) whenever a command changes what the runner may
do, so the runner waits on one descriptor.

A collector that cannot open it (another host, another mount namespace, no FIFOs) sends the same words as ``credit``
and ``free`` messages, which the control thread applies: both ways carry the same words, whose effects commute
(a credit adds one, a slot goes back to the free list), so a collector may mix them.

Records are 8 bytes, written whole (a pipe never splits a write of at most ``PIPE_BUF`` bytes), so a reader reading
multiples of 8 never sees half of one.

Named as the collector's shared-memory segments are (``acollect-<collector pid>-<16 hex digits>``), a pipe is
removed with them by whoever outlives the other: the collector when the worker dies (it knows the name before the
worker starts), a worker when its collector died (:mod:`acollect._workers.orphans`), or
:func:`~acollect._batches.shm.cleanup_stale`.

Examples:
    >>> pipe = CreditPipe.create(credit_pipe_path())
    >>> writer = CreditPipeWriter.open(pipe.path)
    >>> writer.credit(3), writer.free(5), pipe.wake()
    (True, True, None)
    >>> pipe.read()
    [(1, 3), (2, 5), (0, -1)]
    >>> pipe.read()
    []
    >>> writer.close(), pipe.close()
    (None, None)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import stat
import struct
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from acollect._batches.shm import SHM_DIR, SHM_PREFIX, ShmTensorDictSlot
from acollect.errors import ConfigurationError

__all__ = [
    "CREDIT",
    "FREE",
    "WAKE",
    "CreditPipe",
    "CreditPipeWriter",
    "ShmSlotRing",
    "credit_pipe_path",
    "remove_credit_pipe",
]


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


# -- the pipe that gives slots back ------------------------------------------------------------------------
#: Record kinds: a look at the state (the control thread's), a credit (with the slot it gives back, or -1),
#: a slot given back.
WAKE, CREDIT, FREE = 0, 1, 2
_RECORD = struct.Struct("<ii")
_READ = _RECORD.size * 512  # a multiple of the record: a read never ends inside one
NO_SLOT = -1


def credit_pipe_path() -> str:
    """A new pipe's path, named for this process (the collector): in the shared-memory tmpfs where there is one
    (with the segments), else in the temporary directory."""
    directory = SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else tempfile.gettempdir()
    return os.path.join(directory, f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")


def remove_credit_pipe(path: str) -> None:
    """Removes the pipe at ``path`` if it is there (the collector's part once its worker is gone)."""
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.lstat(path).st_mode):  # nothing but a FIFO: the name is the collector's own
            os.unlink(path)


class CreditPipe:
    """The worker's end: a FIFO it made, open for reading and writing (so that it never sees an end of file, and
    its control thread rings it through the same descriptor).

    Args:
        fd: the open descriptor (non-blocking).
        path: the FIFO's path while the collector has not opened it (``None``: an anonymous pipe, for a worker
            without a FIFO; its collector sends messages).
        write_fd: the descriptor :meth:`wake` writes to (the read end's own for a FIFO).
    """

    def __init__(self, fd: int, path: str | None, write_fd: int) -> None:
        self._fd = fd
        self._write_fd = write_fd
        self.path = path
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    @classmethod
    def create(cls, path: str | None) -> CreditPipe:
        """A new FIFO (mode 0600) at ``path``; an anonymous pipe if ``path`` is ``None`` or no FIFO can be made
        there (its :attr:`path` is then ``None``)."""
        if path is None:
            return cls._pipe()
        try:
            os.mkfifo(path, 0o600)
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except (OSError, AttributeError):  # no FIFOs here (os.mkfifo missing, a filesystem without them)
            remove_credit_pipe(path)
            return cls._pipe()
        return cls(fd, path, fd)

    @classmethod
    def _pipe(cls) -> CreditPipe:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        return cls(read_fd, None, write_fd)

    def wake(self) -> None:
        """Rings it: the runner waiting in :meth:`wait` looks at the state again (the control thread's call)."""
        with contextlib.suppress(BlockingIOError):  # full of records: the runner has plenty to wake up to
            os.write(self._write_fd, _RECORD.pack(WAKE, NO_SLOT))

    def wait(self, timeout: float) -> bool:
        """Waits at most ``timeout`` seconds for a record; whether one is there."""
        return bool(self._poll.poll(max(0, int(timeout * 1000))))

    def read(self) -> list[tuple[int, int]]:
        """Every record waiting, as ``(kind, slot)``, oldest first (``[]``: none)."""
        records: list[tuple[int, int]] = []
        while True:
            try:
                data = os.read(self._fd, _READ)
            except BlockingIOError:
                return records
            records.extend(_RECORD.iter_unpack(data))
            if len(data) < _READ:
                return records

    def unlink(self) -> None:
        """Removes the FIFO's name (the collector opened it, or never will); the pipe itself lives on."""
        path, self.path = self.path, None
        if path is not None:
            remove_credit_pipe(path)

    def close(self) -> None:
        """Closes it and removes its name. Idempotent."""
        self.unlink()
        fds = {self._fd, self._write_fd}
        self._fd = self._write_fd = -1
        for fd in fds - {-1}:
            with contextlib.suppress(OSError):
                os.close(fd)


class CreditPipeWriter:
    """The collector's end of a worker's :class:`CreditPipe`: each call writes one record, never waits.

    It holds the FIFO open for reading too, never reading: a pipe with a reader never raises ``SIGPIPE``, which a
    program that restored its default action (command-line tools often do) would die of once the worker is gone.
    Records written after the worker's death are lost with it, as its messages would be (its restart is told what
    matters at its hello), and the pool closes this end when it notices the death.

    Args:
        fd: the FIFO, open for reading and writing (non-blocking).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, path: str) -> CreditPipeWriter:
        """Opens the worker's FIFO at ``path`` and removes its name (nothing else needs it).

        Raises:
            OSError: no FIFO there (another host, another mount namespace), or it cannot be opened.
        """
        # Read and write: never ENXIO, never SIGPIPE (see the class). No link followed: the name is the pool's own.
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise OSError(f"{path} is no FIFO")
        except OSError:
            os.close(fd)
            raise
        remove_credit_pipe(path)
        return cls(fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def credit(self, slot: int | None = None) -> bool:
        """A credit, giving back ``slot`` if not ``None``; ``False`` if it could not go this way (the caller sends
        it as a message instead): this end is closed, or the pipe is full (8,192 records unread, which a live worker
        never leaves)."""
        return self._write(CREDIT, NO_SLOT if slot is None else slot)

    def free(self, slot: int) -> bool:
        """The slot ``slot`` back; ``False`` as for :meth:`credit`."""
        return self._write(FREE, slot)

    def _write(self, kind: int, slot: int) -> bool:
        if self._fd < 0:
            return False
        try:
            os.write(self._fd, _RECORD.pack(kind, slot))
        except OSError:  # BlockingIOError: full
            return False
        return True

    def close(self) -> None:
        """Closes it. Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
