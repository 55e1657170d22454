"""Where a collecting thread's time goes: stepping envs, running the policy, waiting for actions or for the trainer.

Two pieces:

* :class:`Stopwatch` lives with one collecting thread (a worker's runner, the in-process collection thread). The
  code that does a thing says so as it starts it (``stopwatch.switch(ENV)``), and the time since the last switch
  is charged to what was going on before: one clock read per switch, three per step, no allocation.
  :meth:`Stopwatch.take` hands out the seconds spent in each part since the last take; a worker sends them in
  each batch's header.
* :class:`TimeSplitWindow` lives with a collector, on its event loop: it sums the reports of the last seconds,
  per worker, and gives the fractions (:func:`fractions`) and the part that bounds collection
  (:func:`bottleneck`).

The parts, in this order:

* ``"env"``: stepping envs (resets included);
* ``"policy"``: running the policy where the envs run (the random policy's sampling too);
* ``"actions"``: waiting for an inference server's answer, with no env group left to step meanwhile;
* ``"trainer"``: waiting for the trainer to take batches: no credit left, no batch asked for, a pause;
* ``"other"``: everything else: copies into the batch, bookkeeping, sending the batch.

Examples:
    >>> watch = Stopwatch()
    >>> watch.switch(ENV); watch.switch(POLICY); watch.switch(OTHER)
    >>> spent = watch.take()
    >>> len(spent), all(s >= 0 for s in spent)
    (5, True)
    >>> fractions([3.0, 1.0, 0.0, 0.0, 0.0])
    {'env': 0.75, 'policy': 0.25, 'actions': 0.0, 'trainer': 0.0, 'other': 0.0}
    >>> bottleneck({"env": 0.75, "policy": 0.25, "actions": 0.0, "trainer": 0.0, "other": 0.0})
    'env'
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence

__all__ = [
    "ACTIONS",
    "ENV",
    "OTHER",
    "PARTS",
    "POLICY",
    "TRAINER",
    "Stopwatch",
    "TimeSplitWindow",
    "bottleneck",
    "fractions",
]

#: The parts a collecting thread's time is split into, in the order of a report.
PARTS = ("env", "policy", "actions", "trainer", "other")
ENV, POLICY, ACTIONS, TRAINER, OTHER = range(len(PARTS))

#: What each part says about the bottleneck, where it is the largest.
_LIMITS = {"env": "env", "policy": "policy", "actions": "inference", "trainer": "trainer"}
#: Seconds of collecting time (summed over workers) before a bottleneck is named.
MIN_SECONDS = 0.5


class Stopwatch:
    """Charges the time of one thread to the part it is in (see the module's notes).

    Examples:
        >>> watch = Stopwatch()
        >>> watch.switch(TRAINER)
        >>> watch.current == TRAINER
        True
    """

    __slots__ = ("_since", "_spent", "current")

    def __init__(self) -> None:
        self._spent = [0.0] * len(PARTS)
        self._since = time.perf_counter()
        #: the part the thread is in now
        self.current = OTHER

    def switch(self, part: int) -> None:
        """The thread goes on with ``part`` now: the time since the last switch goes to the part it leaves."""
        now = time.perf_counter()
        self._spent[self.current] += now - self._since
        self._since = now
        self.current = part

    def take(self) -> list[float]:
        """Seconds spent in each part (in :data:`PARTS` order) since the last take, the stretch now going on
        included; the thread stays in its part."""
        self.switch(self.current)
        spent, self._spent = self._spent, [0.0] * len(PARTS)
        return spent


def fractions(spent: Sequence[float]) -> dict[str, float]:
    """``spent`` (seconds per part, :data:`PARTS` order) as fractions of their sum (all ``0.0`` for no time)."""
    total = sum(spent)
    return {part: (s / total if total > 0 else 0.0) for part, s in zip(PARTS, spent, strict=True)}


def bottleneck(split: Mapping[str, float], seconds: float = MIN_SECONDS) -> str | None:
    """What bounds collection: ``"env"``, ``"policy"``, ``"inference"`` or ``"trainer"``, for the part (``"other"``
    aside) with the largest share of ``split``; ``None`` when less than :data:`MIN_SECONDS` were measured."""
    if seconds < MIN_SECONDS:
        return None
    part = max(_LIMITS, key=lambda p: split.get(p, 0.0))
    return _LIMITS[part] if split.get(part, 0.0) > 0 else None


class TimeSplitWindow:
    """The time reports of the last ``window_s`` seconds, per worker, summed (on the collector's event loop).

    Examples:
        >>> window = TimeSplitWindow(window_s=10.0)
        >>> window.add(0, [0.2, 0.1, 0.0, 0.7, 0.0], now=1.0)
        >>> window.add(1, [0.8, 0.1, 0.0, 0.1, 0.0], now=2.0)
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
        total = [0.0] * len(PARTS)
        for worker in workers:
            for _, spent in self._reports.get(worker, ()):
                for i, s in enumerate(spent):
                    total[i] += s
        return total

    def split(self) -> dict[str, float]:
        """Fractions of all workers' recent time in each part (summing to 1; all ``0.0`` before any report)."""
        return fractions(self._sum(list(self._reports)))

    def worker_split(self) -> dict[int, dict[str, float]]:
        """The same, per worker id."""
        return {worker: fractions(self._sum([worker])) for worker in sorted(self._reports)}

    def bottleneck(self) -> str | None:
        """What bounds collection now (see :func:`bottleneck`); ``None`` until enough time was measured."""
        spent = self._sum(list(self._reports))
        return bottleneck(fractions(spent), sum(spent))
