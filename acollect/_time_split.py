"""Where a collecting thread's time goes: envs, the policy, and waits for actions, for the trainer or for a core.

Three pieces:

* :class:`Stopwatch` lives with one collecting thread (a worker's runner, the in-process collection thread). The
  code that does a thing says so as it starts it (``stopwatch.switch(ENV)``), and the time since the last switch
  is charged to what was going on before: one clock read per switch, three per step, no allocation.
  :meth:`Stopwatch.take` hands out the seconds spent in each part since the last take; a worker sends them in
  each batch's header, where the collector reads them (:func:`reported_split`).
* :func:`read_schedstat` reads what the kernel counted for the calling thread: its time on a core and its time
  runnable but waiting for one (Linux's ``/proc/thread-self/schedstat``). :meth:`Stopwatch.take` reads it once per
  batch, never per step, and moves the wait out of the parts it happened in into ``"cpu_wait"``: a policy that
  seems slow because its thread waited for a core is not charged for the wait.
* :class:`TimeSplitWindow` lives with a collector, on its event loop: it sums the reports of the last seconds,
  per worker, and gives the fractions (:func:`fractions`) and the part that bounds collection
  (:func:`bottleneck`).

The parts, in this order:

* ``"env"``: stepping envs (resets included);
* ``"policy"``: running the policy where the envs run (the random policy's sampling too);
* ``"actions"``: waiting for an inference server's answer, with no env group left to step meanwhile;
* ``"trainer"``: waiting for the trainer to take batches: no credit left, no batch asked for (a pause counts here
  too, and the collector takes it out again: :class:`~acollect.stats.StatsRecorder`);
* ``"cpu_wait"``: runnable, but waiting for a core (the kernel's run-queue delay); ``NaN`` in a report where the
  kernel does not count it (not Linux, or no ``schedstat``), and then absent from :func:`fractions`;
* ``"other"``: everything else: copies into the batch, bookkeeping, sending the batch.

The wait for a core is read once per batch, so where in the batch it happened is not known: it is taken from the
parts the thread was running in (``"env"``, ``"policy"``, ``"other"``) in proportion to their time, and from the
waits (``"actions"``, ``"trainer"``: a thread woken without a free core) only for what exceeds them.

Examples:
    >>> watch = Stopwatch()
    >>> watch.switch(ENV); watch.switch(POLICY); watch.switch(OTHER)
    >>> spent = watch.take()
    >>> len(spent), all(s >= 0 for s in spent if s == s)  # (``s == s``: NaN where the kernel does not count it)
    (6, True)
    >>> fractions([3.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    {'env': 0.75, 'policy': 0.25, 'actions': 0.0, 'trainer': 0.0, 'cpu_wait': 0.0, 'other': 0.0}
    >>> bottleneck({"env": 0.75, "policy": 0.25, "actions": 0.0, "trainer": 0.0, "cpu_wait": 0.0, "other": 0.0})
    'env'
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ACTIONS",
    "CONTENTION_SHARE",
    "CPU_WAIT",
    "ENV",
    "OTHER",
    "PARTS",
    "POLICY",
    "TRAINER",
    "TRAINER_CORES_MIN",
    "TRAINER_SHARE",
    "Stopwatch",
    "TimeSplitWindow",
    "bottleneck",
    "collecting_cpu_s",
    "fractions",
    "read_schedstat",
    "reported_split",
]

#: The parts a collecting thread's time is split into, in the order of a report.
PARTS = ("env", "policy", "actions", "trainer", "cpu_wait", "other")
ENV, POLICY, ACTIONS, TRAINER, CPU_WAIT, OTHER = range(len(PARTS))

#: What each part says about the bottleneck, where it is the largest (``"cpu_wait"``: see :func:`bottleneck`).
_LIMITS = {"env": "env", "policy": "policy", "actions": "inference", "trainer": "trainer", "cpu_wait": "cpu"}
#: Seconds of collecting time (summed over workers) before a bottleneck is named.
MIN_SECONDS = 0.5
#: The share of the collecting time spent waiting for a core from which that wait, not stepping or the policy,
#: is named the bottleneck (collection would go at least 1.25 times as fast with the cores to itself).
CONTENTION_SHARE = 0.2
#: A wait for cores is laid at the trainer's door (``"trainer_cpu"``) rather than the machine's (``"cpu"``) where the
#: collector's own process kept busy, outside its collecting threads, at least this share of what a collecting
#: thread ran (a contender as busy as half a worker: under contention every contender gets a like share of a core)...
TRAINER_SHARE = 0.5
#: ... and at least these cores (the collector's event loop alone, handing out batches, stays below).
TRAINER_CORES_MIN = 0.1

# The parts in which the thread runs (where a wait for a core happens mostly), and those in which it sleeps.
_RUNNING = (ENV, POLICY, OTHER)
_SLEEPING = (ACTIONS, TRAINER)

_SCHEDSTAT = "/proc/thread-self/schedstat"
# Cleared at the first read that fails: the platform has no such file, and none will appear.
_schedstat_readable = True
# CPU seconds of this process's collecting threads, summed at each take() (see collecting_cpu_s).
_collecting_cpu = [0.0]
_collecting_lock = threading.Lock()


def read_schedstat() -> tuple[int, int] | None:
    """The calling thread's nanoseconds on a core and runnable but waiting for one, since it started.

    Linux counts both for every thread (``/proc/thread-self/schedstat``: the first two fields); elsewhere, or on a
    kernel built without ``schedstat``, this returns ``None``. One open and read: call it per batch, not per step.

    Examples:
        >>> stat = read_schedstat()
        >>> stat is None or (stat[0] >= 0 and stat[1] >= 0)
        True
    """
    global _schedstat_readable
    if not _schedstat_readable:
        return None
    try:
        with open(_SCHEDSTAT, "rb") as file:
            fields = file.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        _schedstat_readable = False
        return None


def collecting_cpu_s() -> float:
    """CPU seconds that collecting threads of this process spent so far (read at each :meth:`Stopwatch.take`).

    A collector's process minus them is its trainer's CPU (and its event loop's): what
    :class:`~acollect.stats.StatsRecorder` measures to tell a trainer that takes the workers' cores. ``0.0`` where
    the kernel does not count it (see :func:`read_schedstat`).
    """
    return _collecting_cpu[0]


class Stopwatch:
    """Charges the time of one thread to the part it is in (see the module's notes).

    :meth:`take` also reads the kernel's count of the calling thread (:func:`read_schedstat`), from the last take in
    the same thread, or from the stopwatch's creation in the thread that made it. Any other thread counts from its
    start: a collecting thread is started to collect (a worker's runner, or the in-process collector's thread, a
    new one for each batch).

    Examples:
        >>> watch = Stopwatch()
        >>> watch.switch(TRAINER)
        >>> watch.current == TRAINER
        True
    """

    __slots__ = ("_sched", "_since", "_spent", "_thread", "current")

    def __init__(self) -> None:
        self._spent = [0.0] * len(PARTS)
        self._since = time.perf_counter()
        #: the part the thread is in now
        self.current = OTHER
        # The thread of the last reading (held: a new thread can never pass for it) and what the kernel said then.
        self._thread = threading.current_thread()
        self._sched = read_schedstat() or (0, 0)

    def switch(self, part: int) -> None:
        """The thread goes on with ``part`` now: the time since the last switch goes to the part it leaves."""
        now = time.perf_counter()
        self._spent[self.current] += now - self._since
        self._since = now
        self.current = part

    def take(self) -> list[float]:
        """Seconds spent in each part (in :data:`PARTS` order) since the last take, the stretch now going on
        included; the thread stays in its part. ``"cpu_wait"`` is ``NaN`` where the kernel does not count it."""
        self.switch(self.current)
        spent, self._spent = self._spent, [0.0] * len(PARTS)
        sched = read_schedstat()
        if sched is None:
            spent[CPU_WAIT] = math.nan
            return spent
        thread = threading.current_thread()
        before = self._sched if thread is self._thread else (0, 0)
        self._thread, self._sched = thread, sched
        with _collecting_lock:
            _collecting_cpu[0] += (sched[0] - before[0]) / 1e9
        _charge_wait(spent, (sched[1] - before[1]) / 1e9)
        return spent


def _charge_wait(spent: list[float], wait: float) -> None:
    """Moves ``wait`` seconds into ``"cpu_wait"``: from the running parts in proportion to their time, then from
    the sleeping ones (a wake-up without a free core) for the rest; never more than was measured."""
    wait = max(0.0, min(wait, sum(spent)))
    spent[CPU_WAIT] = wait
    for parts in (_RUNNING, _SLEEPING):
        pool = sum(spent[p] for p in parts)
        if pool <= 0.0 or wait <= 0.0:
            continue
        taken = min(wait, pool)
        for p in parts:
            spent[p] -= taken * spent[p] / pool
        wait -= taken


def reported_split(header: Mapping[str, Any]) -> list[float] | None:
    """The seconds per part a batch's header reports (what :meth:`Stopwatch.take` gave its worker); ``None`` if it
    has none.

    Examples:
        >>> reported_split({"time": [1, 0.5]}), reported_split({"time": "soon"}), reported_split({})
        ([1.0, 0.5], None, None)
    """
    spent = header.get("time")
    if not isinstance(spent, list) or not all(isinstance(s, (int, float)) for s in spent):
        return None  # a peer that does not report it (or reports nonsense): nothing learnt, nothing broken
    return [float(s) for s in spent]


def fractions(spent: Sequence[float]) -> dict[str, float]:
    """``spent`` (seconds per part, :data:`PARTS` order) as fractions of their sum (all ``0.0`` for no time).

    A ``NaN`` ``"cpu_wait"`` (not counted here) leaves the part out.

    Examples:
        >>> fractions([1.0, 1.0, 0.0, 0.0, float("nan"), 0.0])
        {'env': 0.5, 'policy': 0.5, 'actions': 0.0, 'trainer': 0.0, 'other': 0.0}
    """
    counted = [(part, s) for part, s in zip(PARTS, spent, strict=True) if not math.isnan(s)]
    total = sum(s for _, s in counted)
    return {part: (s / total if total > 0 else 0.0) for part, s in counted}


def bottleneck(
    split: Mapping[str, float], seconds: float = MIN_SECONDS, *, trainer_cores: float | None = None
) -> str | None:
    """What bounds collection: the part (``"other"`` aside) with the largest share of ``split``, or the wait for a
    core where it is at least :data:`CONTENTION_SHARE` and the largest part is one the thread runs in.

    ``"env"``, ``"policy"``, ``"inference"`` (``"actions"``) or ``"trainer"`` as the part says. A wait for a core
    outweighs stepping and the policy from :data:`CONTENTION_SHARE` on, as their advice (more workers, more envs)
    needs free cores; it does not outweigh a wait for the trainer or the server, which would stay. It is named
    ``"trainer_cpu"`` where the collector's own process kept ``trainer_cores`` cores busy outside its collecting
    threads, as a contender for them (at least :data:`TRAINER_SHARE` of the share of its time a collecting thread
    ran, and :data:`TRAINER_CORES_MIN`), else ``"cpu"`` (more busy threads than cores: workers, torch threads,
    other jobs). ``None`` when less than :data:`MIN_SECONDS` were measured.

    Examples:
        >>> split = {"env": 0.55, "policy": 0.1, "trainer": 0.0, "cpu_wait": 0.35}
        >>> bottleneck(split), bottleneck(split, trainer_cores=0.02), bottleneck(split, trainer_cores=0.9)
        ('cpu', 'cpu', 'trainer_cpu')
        >>> bottleneck({"env": 0.2, "trainer": 0.5, "cpu_wait": 0.3})  # the trainer would stay the limit
        'trainer'
    """
    if seconds < MIN_SECONDS:
        return None
    part = max(_LIMITS, key=lambda p: split.get(p, 0.0))
    if split.get(part, 0.0) <= 0:
        return None
    if part in ("env", "policy") and split.get("cpu_wait", 0.0) >= CONTENTION_SHARE:
        part = "cpu_wait"
    if part == "cpu_wait" and trainer_cores is not None:
        running = sum(split.get(PARTS[p], 0.0) for p in _RUNNING)
        if trainer_cores >= max(TRAINER_CORES_MIN, TRAINER_SHARE * running):
            return "trainer_cpu"
    return _LIMITS[part]


class TimeSplitWindow:
    """The time reports of the last ``window_s`` seconds, per worker, summed (on the collector's event loop).

    Examples:
        >>> window = TimeSplitWindow(window_s=10.0)
        >>> window.add(0, [0.2, 0.1, 0.0, 0.7, 0.0, 0.0], now=1.0)
        >>> window.add(1, [0.8, 0.1, 0.0, 0.1, 0.0, 0.0], now=2.0)
        >>> window.split()["env"], window.worker_split()[1]["env"]
        (0.5, 0.8)
        >>> window.bottleneck()
        'env'
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._reports: dict[int, deque[tuple[float, list[float]]]] = {}

    def add(self, worker: int, spent: Sequence[float], *, now: float | None = None) -> None:
        """Takes one report of ``worker``: seconds per part since its last one."""
        if len(spent) != len(PARTS):
            return  # a report of another shape (a peer of another version): nothing to learn from it
        t = time.monotonic() if now is None else now
        reports = self._reports.setdefault(worker, deque())
        reports.append((t, [float(s) for s in spent]))
        # The newest report stays, however old: a worker that reports rarely (long batches) is still seen.
        while len(reports) > 1 and reports[0][0] < t - self.window_s:
            reports.popleft()

    def forget(self, worker: int) -> None:
        """Drops a worker's reports (it was lost for good)."""
        self._reports.pop(worker, None)

    def _sum(self, workers: Sequence[int]) -> list[float]:
        # A wait for a core that no report counted stays NaN (absent from the fractions); one counted by any is kept.
        # Before any report, every part is there at 0.0.
        total = [0.0] * len(PARTS)
        counted = not any(self._reports.get(worker) for worker in workers)
        for worker in workers:
            for _, spent in self._reports.get(worker, ()):
                for i, s in enumerate(spent):
                    if i == CPU_WAIT and math.isnan(s):
                        continue
                    total[i] += s
                counted = counted or not math.isnan(spent[CPU_WAIT])
        if not counted:
            total[CPU_WAIT] = math.nan
        return total

    def split(self) -> dict[str, float]:
        """Fractions of all workers' recent time in each part (summing to 1; all ``0.0`` before any report)."""
        return fractions(self._sum(list(self._reports)))

    def worker_split(self) -> dict[int, dict[str, float]]:
        """The same, per worker id."""
        return {worker: fractions(self._sum([worker])) for worker in sorted(self._reports)}

    def bottleneck(self, *, trainer_cores: float | None = None) -> str | None:
        """What bounds collection now (see :func:`bottleneck`); ``None`` until enough time was measured."""
        spent = self._sum(list(self._reports))
        seconds = math.fsum(s for s in spent if not math.isnan(s))
        return bottleneck(fractions(spent), seconds, trainer_cores=trainer_cores)
