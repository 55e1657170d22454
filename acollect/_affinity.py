"""Pinning processes to CPU cores: the ``worker_affinity`` option checked, planned per process, and applied.

A multi-process collector's ``worker_affinity`` is ``None`` (nothing pinned), ``"auto"`` or a list with one
set of core ids per worker. :func:`check_worker_affinity` checks the value at construction,
:func:`plan_affinity` turns it into the cores of each worker and of the trainer (:class:`AffinityPlan`), each
worker pins itself at its start with :func:`pin_process` (its env threads, built afterwards, inherit the
mask), and :class:`TrainerPin` pins the trainer's threads and restores them at shutdown.

Linux keeps one affinity mask per *thread*: ``os.sched_setaffinity(pid, ...)`` changes the thread whose id
is ``pid`` (the main thread, for a process id), and a new thread inherits its creator's mask. So a process
is pinned by pinning every thread listed in ``/proc/<pid>/task``; threads it starts afterwards follow.

Examples:
    >>> plan = plan_affinity([{0}, {1}], 2)
    >>> plan.workers, plan.trainer
    (((0,), (1,)), None)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from acollect.errors import ConfigurationError

__all__ = [
    "AUTO",
    "AffinityPlan",
    "TrainerPin",
    "can_pin",
    "check_worker_affinity",
    "pin_process",
    "plan_affinity",
    "usable_cores",
]

#: The value of ``worker_affinity`` that places every worker on a core of its own.
AUTO = "auto"

Cores = tuple[int, ...]


def can_pin() -> bool:
    """Whether this platform pins processes to cores (``os.sched_setaffinity``: Linux, not macOS)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def usable_cores() -> list[int]:
    """The cores this process may run on, in order (all of them where the platform cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _expected(usable: Sequence[int]) -> str:
    return (
        "None, 'auto', or a list with one non-empty set of core ids per worker (such as [{0}, {1}, {2, 3}]), "
        f"among the cores this process may use: {list(usable)}"
    )


def check_worker_affinity(name: str, value: Any) -> str | list[frozenset[int]] | None:
    """The ``worker_affinity`` kept: ``None``, ``"auto"`` or one frozenset of cores per worker.

    The number of sets is checked against the number of workers by :func:`plan_affinity`, once it is known.

    Raises:
        ConfigurationError: naming ``name``, the value and what is accepted; on a platform without
            ``os.sched_setaffinity`` (macOS), any value but ``None``.

    Examples:
        >>> check_worker_affinity("worker_affinity", [[0], {0}])
        [frozenset({0}), frozenset({0})]
        >>> check_worker_affinity("worker_affinity", [set()])
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: worker_affinity=[set()] is invalid: expected None, 'auto', or a list ...
    """
    if value is None:
        return None
    if not can_pin():
        raise ConfigurationError.bad_value(
            name,
            value,
            f"None: this platform ({sys.platform}) cannot pin a process to cores (it has no os.sched_setaffinity)",
        )
    usable = usable_cores()
    if isinstance(value, str):
        if value == AUTO:
            return AUTO
        raise ConfigurationError.bad_value(name, value, _expected(usable))
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigurationError.bad_value(name, value, _expected(usable))
    sets = []
    for item in value:
        if not isinstance(item, (set, frozenset, list, tuple)) or not item:
            raise ConfigurationError.bad_value(name, value, _expected(usable))
        if any(type(core) is not int or core not in usable for core in item):
            raise ConfigurationError.bad_value(name, value, _expected(usable))
        sets.append(frozenset(item))
    return sets


@dataclass(frozen=True)
class AffinityPlan:
    """Where each process of a collector runs.

    Attributes:
        workers: each worker's cores, sorted (``None``: left as it starts, unpinned).
        trainer: the trainer's cores (``None``: the trainer is left as it is).
    """

    workers: tuple[Cores | None, ...]
    trainer: Cores | None


def plan_affinity(value: str | Sequence[Iterable[int]] | None, n_workers: int) -> AffinityPlan:
    """The cores of each worker and of the trainer for a checked ``worker_affinity``.

    ``"auto"`` gives worker ``i`` the ``i``-th core this process may use (round-robin: more workers than cores
    share them) and the trainer the cores left; with none left, the trainer stays unpinned. A list places the
    workers by hand and leaves the trainer alone.

    Raises:
        ConfigurationError: a list whose length is not ``n_workers``.

    Examples:
        >>> import os
        >>> usable = usable_cores()
        >>> plan = plan_affinity("auto", 1)
        >>> plan.workers == ((usable[0],),), plan.trainer == (tuple(usable[1:]) or None)
        (True, True)
    """
    if value is None:
        return AffinityPlan((None,) * n_workers, None)
    if isinstance(value, str):  # "auto" (check_worker_affinity refused any other string)
        usable = usable_cores()
        workers = tuple((usable[i % len(usable)],) for i in range(n_workers))
        taken = {core for cores in workers for core in cores}
        left = tuple(core for core in usable if core not in taken)
        return AffinityPlan(workers, left or None)
    sets = list(value)
    if len(sets) != n_workers:
        given = [set(cores) for cores in sets]  # as given: the check kept frozensets
        raise ConfigurationError.bad_value(
            "worker_affinity", given, f"'auto', None, or a list of {n_workers} core sets (one per worker)"
        )
    return AffinityPlan(tuple(tuple(sorted(cores)) for cores in sets), None)


def _threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (``0``: this one)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid or os.getpid()}/task")]
    except OSError:  # no /proc: the process's main thread is all that can be named
        return [pid or os.getpid()]


def pin_process(pid: int, cores: Iterable[int]) -> None:
    """Pins every thread of process ``pid`` (``0``: this process) to ``cores``; threads it starts later inherit it.

    Raises:
        OSError: the cores are not this process's to give (a cgroup took them since), or ``pid`` is gone.
    """
    mask = set(cores)
    os.sched_setaffinity(pid, mask)  # the main thread first: a process that is gone raises here
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, mask)


class TrainerPin:
    """This process's threads pinned to ``cores`` while a collector runs, and their affinity given back after.

    Args:
        cores: the trainer's cores (``None``: nothing is pinned, :meth:`pin` and :meth:`restore` do nothing).

    Examples:
        >>> import os
        >>> before = os.sched_getaffinity(0)
        >>> pin = TrainerPin((min(before),))
        >>> pin.pin(); os.sched_getaffinity(0) == {min(before)}
        True
        >>> pin.restore(); os.sched_getaffinity(0) == before
        True
    """

    def __init__(self, cores: Cores | None) -> None:
        self._cores = cores
        self._before: dict[int, set[int]] | None = None  # each thread's mask before, while pinned
        self._default: set[int] = set()  # for threads started while pinned: the pinning thread's mask before

    @property
    def cores(self) -> Cores | None:
        """The cores the trainer is pinned to while the collector runs (``None``: it is left as it is)."""
        return self._cores

    @property
    def pinned(self) -> bool:
        """Whether the trainer's threads are pinned now."""
        return self._before is not None

    def pin(self) -> None:
        """Pins every thread of this process to the trainer's cores (once; again after :meth:`restore`)."""
        if self._cores is None or self._before is not None:
            return
        before = {}
        for tid in _threads(0):
            with contextlib.suppress(ProcessLookupError):
                before[tid] = os.sched_getaffinity(tid)
        self._default = os.sched_getaffinity(0)
        self._before = before
        pin_process(0, self._cores)

    def restore(self) -> None:
        """Gives each thread back the mask it had before :meth:`pin` (a thread started since: the pinning
        thread's). Idempotent."""
        before, self._before = self._before, None
        if before is None:
            return
        for tid in _threads(0):
            with contextlib.suppress(OSError):  # a thread that ended, or a core a cgroup took back since
                os.sched_setaffinity(tid, before.get(tid, self._default))
