"""Shared memory lent to the caller: handed out as it is, and given back when the last tensor over it is gone.

A worker writes each batch into shared memory; handing that memory out saves a copy of every byte (for pixel
batches, most of a collector's time). It is safe only if the memory is never written again while the caller holds
any tensor over it: a batch kept in a list, a view of one, a replay buffer that stores references. So
:meth:`Lender.lend` makes new tensors over the same memory that keep a *loan* alive: each is a view of a base tensor
made with :func:`torch.from_numpy` over a small numpy array, whose lifetime is the storage's, and that array's
finalizer returns the loan. Views, slices, sub-TensorDicts and numpy arrays of those tensors all keep it; copies
(``.clone()``, ``.to(device)``, ``torch.stack``) do not need it. When the last one is gone, the loan's token is
queued and the owner is woken (:attr:`Lender.wake`, called from whichever thread dropped the last tensor: the
owner's event loop is told with ``call_soon_threadsafe``); the owner takes the tokens back with
:meth:`Lender.returned` and only then lets the memory be written again.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> lender = Lender()
    >>> memory = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    >>> lent = lender.lend(memory, token="slot 0")
    >>> view = lent["x"][1:]
    >>> del lent
    >>> lender.returned()  # a view is still alive
    []
    >>> int(view.sum())
    6
    >>> del view
    >>> lender.returned()
    ['slot 0']
"""

from __future__ import annotations

import shutil
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Any, cast

import torch
from tensordict import TensorDict, TensorDictBase

from acollect._batches.shm import SHM_DIR
from acollect._runtime.layout import FAST_ASSEMBLY, unchecked_node

__all__ = ["DEFAULT_LENT_BYTES", "Lender", "Loans", "default_budget"]


class _Loan:
    """One lent batch: its token, and how many of its memory regions are still held."""

    __slots__ = ("held", "lender", "nbytes", "token")

    def __init__(self, lender: Lender, token: Hashable, held: int, nbytes: int) -> None:
        self.lender = lender
        self.token = token
        self.held = held
        self.nbytes = nbytes

    def region_gone(self) -> None:  # a finalizer: any thread, never raises
        with self.lender.lock:
            self.held -= 1
            if self.held:
                return
        self.lender.came_back(self)


def _plain_leaves(td: TensorDictBase) -> list[torch.Tensor] | None:
    """Every leaf of ``td`` if it is made of plain TensorDicts and tensors only, else ``None`` (the generic path)."""
    if type(td) is not TensorDict or not FAST_ASSEMBLY:
        return None
    found: list[torch.Tensor] = []
    for value in td._tensordict.values():
        if isinstance(value, torch.Tensor):
            found.append(value)
            continue
        below = _plain_leaves(value)
        if below is None:
            return None
        found.extend(below)
    return found


def _held(storage: Any, loan: _Loan) -> torch.Tensor:
    """``storage`` as bytes, in a tensor whose lifetime (and that of every view of it) holds ``loan``'s region."""
    whole = torch.empty(0, dtype=torch.uint8).set_(storage)
    keeper = whole.numpy()  # lives as long as any tensor made from it
    weakref.finalize(keeper, loan.region_gone)
    return torch.from_numpy(keeper)


def _seen_as(base: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bytes of ``base`` seen as ``dtype`` (a tail shorter than one element left out)."""
    size = dtype.itemsize
    return base.view(dtype) if base.numel() % size == 0 else base[: base.numel() // size * size].view(dtype)


class _Plan:
    """How a plain TensorDict is lent: worked out at each loan, or once for a fixed one (``Lender.lend(fixed=True)``).

    Its leaves in walk order, which storage each lies in and how it is seen, and its nodes' keys, batch sizes and
    dim names. It holds the TensorDict's own leaves, so it lives no longer than the TensorDict (``Lender`` drops it
    when the TensorDict goes), and the memory stays free to be unmapped.
    """

    __slots__ = ("keep", "leaves", "nbytes", "places", "regions", "storages", "tree")

    def __init__(self, td: TensorDict, leaves: list[torch.Tensor]) -> None:
        self.leaves = leaves
        storage_of: dict[int, int] = {}  # a storage's address: its index in ``storages``
        self.storages: list[int] = []  # per storage: the index of a leaf over it
        region_of: dict[tuple[int, torch.dtype], int] = {}
        self.regions: list[tuple[int, torch.dtype]] = []  # per region: its storage, seen as this dtype
        self.places: list[tuple[int, torch.Size, tuple[int, ...], int] | None] = []  # per leaf: region and view
        nbytes = 0
        for index, leaf in enumerate(leaves):
            if not (leaf.is_cpu and leaf.numel()):
                self.places.append(None)  # kept as it is (another device, or empty)
                continue
            storage = leaf.untyped_storage()
            address = storage.data_ptr()
            if address not in storage_of:
                storage_of[address] = len(self.storages)
                self.storages.append(index)
                nbytes += int(storage.nbytes())
            key = (storage_of[address], leaf.dtype)
            if key not in region_of:
                region_of[key] = len(self.regions)
                self.regions.append(key)
            self.places.append((region_of[key], leaf.shape, leaf.stride(), int(leaf.storage_offset())))
        self.nbytes = nbytes
        self.keep = not self.storages  # nothing to hold: the TensorDict is handed out as it is
        self.tree = _tree(td, iter(range(len(leaves))))


def _tree(td: TensorDict, numbers: Any) -> tuple[Any, ...]:
    """``td``'s nodes as ``(entries, batch_size, dim names)``; each entry ``(key, leaf number or node)``."""
    entries = [
        (key, _tree(value, numbers) if type(value) is TensorDict else next(numbers))
        for key, value in td._tensordict.items()
    ]
    return entries, td.batch_size, td._td_dim_names


def _plan_of(td: TensorDictBase) -> _Plan | None:
    """A plan for ``td`` if it is a plain TensorDict (see :func:`_plain_leaves`), else ``None``."""
    leaves = _plain_leaves(td)
    return _Plan(cast(TensorDict, td), leaves) if leaves is not None else None


def _built(tree: tuple[Any, ...], leaves: list[torch.Tensor]) -> TensorDict:
    entries, batch_size, names = tree
    source = {key: leaves[at] if type(at) is int else _built(at, leaves) for key, at in entries}
    return unchecked_node(source, batch_size, names)


class Lender:
    """Lends CPU memory as tensors whose lifetime returns it (see the module's notes).

    Thread-safe: tokens come back from whichever thread drops the last tensor of a loan.

    Attributes:
        wake: called (from any thread) when a loan came back; ``None``: the owner looks at :meth:`returned` itself.
    """

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self.wake = wake
        #: guards the loans (taken by a loan's finalizer, from any thread)
        self.lock = threading.Lock()
        self._back: deque[Hashable] = deque()
        self._lent_bytes = 0
        self._outstanding = 0
        # Fixed TensorDicts lent before, by id: (a weak reference to tell a reused id, its plan).
        self._plans: dict[int, tuple[weakref.ref[TensorDictBase], _Plan]] = {}

    @property
    def lent_bytes(self) -> int:
        """Bytes lent and not returned yet."""
        return self._lent_bytes

    @property
    def outstanding(self) -> int:
        """Loans not returned yet."""
        return self._outstanding

    @property
    def plans_kept(self) -> int:
        """TensorDicts lent with ``fixed=True`` whose plan is kept (each until that TensorDict is gone)."""
        return len(self._plans)

    def lend(self, td: TensorDictBase, token: Hashable, *, fixed: bool = False) -> TensorDictBase:
        """A TensorDict over the same memory as ``td`` whose tensors hold a loan of ``token``.

        ``td``'s leaves are CPU tensors (views of one or a few storages: shared-memory segments); leaves on
        another device are kept as they are. ``token`` is returned (:meth:`returned`) once no tensor over the lent
        memory is alive, however many views, slices or sub-TensorDicts of it the caller made.

        ``fixed=True`` says that ``td`` is a memory owner's own TensorDict, lent again and again, whose keys and
        leaves never change (a slot's views): how to lend it is worked out once and kept while ``td`` lives.
        """
        # A plain TensorDict (a slot's views) is walked through its own dicts: on a batch of a dozen leaves,
        # tensordict's generic traversal (values(), apply()) costs the trainer more than the rest of the hand-out.
        plan = self._plan(td) if fixed else _plan_of(td)
        if plan is not None:
            return self._lend_planned(plan, token)
        leaves = list(td.values(include_nested=True, leaves_only=True))
        by_storage: dict[int, Any] = {}
        addresses: dict[int, int] = {}  # id(leaf): its storage's address, asked once
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.is_cpu and leaf.numel():
                storage = leaf.untyped_storage()
                address = storage.data_ptr()
                addresses[id(leaf)] = address
                by_storage.setdefault(address, storage)
        nbytes = sum(int(s.nbytes()) for s in by_storage.values())
        loan = _Loan(self, token, len(by_storage), nbytes)
        bases = {address: _held(storage, loan) for address, storage in by_storage.items()}
        with self.lock:
            self._lent_bytes += nbytes
            self._outstanding += 1
        if not bases:
            loan.held = 1
            loan.region_gone()  # nothing to hold: returned at once
            return td
        regions: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # a base seen as each dtype, once

        def rebase(leaf: torch.Tensor) -> torch.Tensor:
            address = addresses.get(id(leaf))
            if address is None:  # not among the leaves seen above (a leaf apply() made), or not lent
                if not (leaf.is_cpu and leaf.numel()):
                    return leaf
                address = leaf.untyped_storage().data_ptr()
            region = regions.get((address, leaf.dtype))
            if region is None:
                region = regions[address, leaf.dtype] = _seen_as(bases[address], leaf.dtype)
            return region.as_strided(leaf.shape, leaf.stride(), leaf.storage_offset())

        lent = td.apply(rebase, filter_empty=False)
        assert lent is not None
        return lent

    def _plan(self, td: TensorDictBase) -> _Plan | None:
        """``td``'s plan, made at its first loan (``None``: not a plain TensorDict, lent the generic way)."""
        found = self._plans.get(id(td))
        if found is not None and found[0]() is td:
            return found[1]
        plan = _plan_of(td)
        if plan is None:
            return None
        key = id(td)

        def forget(_: object, plans: dict[int, Any] = self._plans) -> None:  # td is gone: so is its plan
            entry = plans.get(key)
            if entry is not None and entry[0]() is None:
                del plans[key]

        self._plans[key] = (weakref.ref(td, forget), plan)
        return plan

    def _lend_planned(self, plan: _Plan, token: Hashable) -> TensorDictBase:
        leaves = plan.leaves
        loan = _Loan(self, token, len(plan.storages), plan.nbytes)
        with self.lock:
            self._lent_bytes += plan.nbytes
            self._outstanding += 1
        if plan.keep:
            loan.held = 1
            loan.region_gone()  # nothing to hold: returned at once
            return _built(plan.tree, leaves)
        bases = [_held(leaves[index].untyped_storage(), loan) for index in plan.storages]
        regions = [_seen_as(bases[storage], dtype) for storage, dtype in plan.regions]
        lent = [
            leaf if place is None else regions[place[0]].as_strided(place[1], place[2], place[3])
            for leaf, place in zip(leaves, plan.places, strict=True)
        ]
        return _built(plan.tree, lent)

    def came_back(self, loan: _Loan) -> None:
        """The last tensor of ``loan`` is gone (from its finalizer, in any thread): its token is queued."""
        with self.lock:
            self._back.append(loan.token)
            self._lent_bytes -= loan.nbytes
            self._outstanding -= 1
        wake = self.wake
        if wake is not None:
            try:
                wake()
            except Exception:  # the owner's loop is gone: the token waits in the queue, harmless
                pass

    def returned(self) -> list[Hashable]:
        """The tokens of the loans that came back since the last call."""
        with self.lock:
            back = list(self._back)
            self._back.clear()
        return back


#: The most shared memory lent at once, by default: beyond it batches are copies (see default_budget).
DEFAULT_LENT_BYTES = 1 << 30


def default_budget() -> int:
    """:data:`DEFAULT_LENT_BYTES`, or a quarter of ``/dev/shm`` where that is less (a container's is often small)."""
    try:
        total = shutil.disk_usage(SHM_DIR).total
    except OSError:
        return DEFAULT_LENT_BYTES
    return max(1, min(DEFAULT_LENT_BYTES, total // 4))


class Loans:
    """The loans of a collector's lent batches: how many each memory owner has out, and the budget.

    Examples:
        >>> from tensordict import TensorDict
        >>> loans = Loans(budget=1 << 20)
        >>> batch = loans.lend(TensorDict({"x": torch.zeros(8)}, batch_size=[8]), key=("w", 0), token=3)
        >>> loans.held(("w", 0)), loans.lent_bytes
        (1, 32)
        >>> del batch
        >>> loans.returned()
        [(('w', 0), 3)]
        >>> loans.held(("w", 0))
        0

    Args:
        budget: the most bytes lent at once (beyond it the collector hands out copies).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.lender = Lender()
        self._held: Counter[Hashable] = Counter()
        #: batches handed out as copies because lending them would have passed the budget
        self.over_budget = 0
        #: batches lent so far
        self.lent_batches = 0

    @property
    def lent_bytes(self) -> int:
        """Shared memory lent now (bytes)."""
        return self.lender.lent_bytes

    @property
    def outstanding(self) -> int:
        """Batches lent and not given back yet."""
        return self.lender.outstanding

    def room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be lent; counts a refusal (the batch is then a copy)."""
        if self.lender.lent_bytes + nbytes <= self.budget:
            return True
        self.over_budget += 1
        return False

    def held(self, key: Hashable) -> int:
        """Batches out from the memory owner ``key`` (a worker's incarnation, or the lockstep segments)."""
        return self._held[key]

    def lend(self, td: TensorDictBase, *, key: Hashable, token: Hashable, fixed: bool = False) -> TensorDictBase:
        """``td`` lent (new tensors over its memory); ``(key, token)`` comes back from :meth:`returned` once dropped.

        ``fixed``: see :meth:`Lender.lend`."""
        self._held[key] += 1
        self.lent_batches += 1
        return self.lender.lend(td, (key, token), fixed=fixed)

    def returned(self) -> list[tuple[Hashable, Hashable]]:
        """``(key, token)`` of every lent batch given back since the last call."""
        back: list[tuple[Hashable, Hashable]] = []
        for returned in self.lender.returned():
            key, token = cast(tuple[Hashable, Hashable], returned)  # what lend() queued: the lender keeps any token
            self._held[key] -= 1
            back.append((key, token))
        return back
