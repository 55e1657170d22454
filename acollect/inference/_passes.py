"""Forward passes in flight: a few threads, each running one pass at a time, so that the server never waits on one.

A pass on a GPU (or on anything that frees the CPU while it runs) costs its launch, its copies and its wait for
the device; a server that runs one pass at a time keeps every other request waiting for all of it, and the
workers idle. :class:`PassRunner` runs up to ``in_flight`` passes at once, each in a thread of its own with its
own :class:`~acollect.inference._batching.Lane` (a CUDA stream and page-locked staging buffers on a GPU), so
that gathering and copying one pass overlaps the forward of another. The server's loop thread hands it batches
only when a thread is free (requests keep gathering into a larger batch meanwhile), and applies weights only when
no pass runs.

A pass's callers are answered by the thread that ran it: a same-host worker's slot (its actions written in
place, then a wake-up) and an in-process caller's mailbox are safe from any thread; answers for ZeroMQ
clients, and a pass's failure, go back to the loop thread (:meth:`PassRunner.finished`), which owns the socket.

Examples:
    >>> from acollect.inference._batching import InferenceRequest
    >>> done = []
    >>> def forward(requests, version, lane):
    ...     for request in requests:
    ...         request.outputs, request.version = {}, version
    >>> runner = PassRunner(forward, in_flight=2, on_done=lambda: None)
    >>> runner.submit([InferenceRequest({}, 2)], version=3)
    >>> runner.wait_idle(timeout=5.0)
    True
    >>> [(len(p.requests), p.error) for p in runner.finished()]  # the loop thread answers it
    [(1, None)]
    >>> runner.close(timeout=5.0)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from acollect.inference._batching import InferenceRequest, Lane

__all__ = ["DonePass", "PassRunner"]

#: runs one pass: fills every request's outputs and version (or raises what the policy raised)
ForwardFn = Callable[[Sequence[InferenceRequest], int, Lane], None]


@dataclass
class DonePass:
    """A pass that ended: the requests the loop thread answers (all of them if it failed), and its failure."""

    requests: list[InferenceRequest]
    error: BaseException | None = None


class PassRunner:
    """Up to ``in_flight`` forward passes at once, each in a thread with its own lane.

    Args:
        forward: runs one pass (see :class:`~acollect.inference._batching.Forward`).
        in_flight: how many passes may run at once (threads).
        on_done: called from a pass's thread when it ended (wakes the loop thread).
        make_lane: builds each thread's lane (default: a CPU lane).
        answer: answers a request from the pass's thread where that is safe, and says whether it did (``None``:
            the loop thread answers every request, from :meth:`finished`).
        record: counts a pass that ran (its requests, when it started and ended), one pass at a time.
        running: told when the longest-running pass started, whenever that changes (``None``: none runs).
        inline: run each pass in the thread that submits it (``in_flight`` must be 1): for a pass that holds the
            CPU all along (a policy on a CPU), a thread of its own would only add two hand-offs per pass, and
            its GIL shared with the loop thread, for nothing to overlap.
        torch_threads: torch's threads in each pass thread (``None``: leave them): a new thread does not follow
            its creator's ``torch.set_num_threads()`` (OpenMP keeps the count per thread).
    """

    def __init__(
        self,
        forward: ForwardFn,
        *,
        in_flight: int,
        on_done: Callable[[], None],
        make_lane: Callable[[], Lane] = Lane,
        answer: Callable[[InferenceRequest], bool] | None = None,
        record: Callable[[Sequence[InferenceRequest], float, float], None] | None = None,
        running: Callable[[float | None], None] | None = None,
        inline: bool = False,
        torch_threads: int | None = None,
    ) -> None:
        self._torch_threads = torch_threads
        if inline and in_flight != 1:
            raise ValueError(f"inline passes run one at a time: in_flight must be 1, got {in_flight}")
        self._forward = forward
        self._on_done = on_done
        self._answer = answer
        self._record = record
        self._on_running = running
        self._cond = threading.Condition()
        self._jobs: deque[tuple[list[InferenceRequest], int] | None] = deque()
        self._done: deque[DonePass] = deque()
        self._running: dict[int, float] = {}  # thread index -> when its pass started
        self._busy = 0  # passes handed over and not finished
        self._in_flight = in_flight
        self._inline = inline
        self._inline_lane = _once(make_lane)
        self._threads = (
            []
            if inline
            else [
                threading.Thread(target=self._serve, args=(i, make_lane), name=f"acollect-pass-{i}", daemon=True)
                for i in range(in_flight)
            ]
        )
        for thread in self._threads:
            thread.start()

    @property
    def in_flight(self) -> int:
        """How many passes may run at once."""
        return self._in_flight

    @property
    def busy(self) -> int:
        """Passes handed over and not finished yet."""
        return self._busy

    @property
    def free(self) -> bool:
        """Whether a thread is free for a pass."""
        return self._busy < self._in_flight

    @property
    def oldest_start(self) -> float | None:
        """When the longest-running pass started (``None``: none runs): a hung pass shows here."""
        with self._cond:
            return min(self._running.values(), default=None)

    def submit(self, requests: list[InferenceRequest], version: int) -> None:
        """Runs a pass over ``requests`` with weights ``version`` (a thread must be free: see :attr:`free`)."""
        with self._cond:
            assert self._busy < self._in_flight, "no thread is free for a pass"
            self._busy += 1
            if not self._inline:
                self._jobs.append((requests, version))
                self._cond.notify()
                return
        self._run(0, requests, version, self._inline_lane)  # here, now: see ``inline``

    def finished(self) -> list[DonePass]:
        """The passes that ended since the last call (for the loop thread)."""
        done: list[DonePass] = []
        while self._done:
            done.append(self._done.popleft())
        return done

    def wait_idle(self, timeout: float) -> bool:
        """Waits until no pass runs; returns whether none does."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float) -> None:
        """Lets the passes that run finish (up to ``timeout`` seconds) and ends the threads. Idempotent."""
        with self._cond:
            self._jobs.extend([None] * len(self._threads))
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            # A pass that never returns (a hung policy) cannot be interrupted: its daemon thread dies with the
            # process, and the hang was reported by the server's liveness check.
            thread.join(max(0.0, deadline - time.monotonic()))

    def _serve(self, index: int, make_lane: Callable[[], Lane]) -> None:
        lane = _once(make_lane)  # made by the first pass, on this thread (where its CUDA stream is used)
        if self._torch_threads is not None:
            torch.set_num_threads(self._torch_threads)
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
            if job is None:
                return
            self._run(index, *job, lane)

    def _run(self, index: int, requests: list[InferenceRequest], version: int, lane: Callable[[], Lane]) -> None:
        """Runs one pass, counts it, answers what this thread may answer, and leaves the rest to the loop thread."""
        started = time.monotonic()
        with self._cond:
            self._running[index] = started
            self._tell_running()
        error: BaseException | None = None
        try:
            self._forward(requests, version, lane())
        except BaseException as exc:  # the loop thread raises it, after its callers are told
            error = exc
        ended = time.monotonic()
        if error is None and self._record is not None:
            with self._cond:  # counted before anyone is answered: an answer never runs ahead of the figures
                self._record(requests, started, ended)
        kept = []
        for request in requests:
            if error is None and self._answer is not None and self._answer(request):
                continue
            if request.outputs is not None:  # views of this lane's buffers, which its next pass writes
                request.outputs = {key: value.clone() for key, value in request.outputs.items()}
            kept.append(request)  # the loop thread answers it
        with self._cond:
            del self._running[index]
            self._tell_running()
            self._done.append(DonePass(kept, error))
            self._busy -= 1
            self._cond.notify_all()
        self._on_done()

    def _tell_running(self) -> None:
        if self._on_running is not None:
            self._on_running(min(self._running.values(), default=None))


def _once(make: Callable[[], Lane]) -> Callable[[], Lane]:
    """``make``, called on first use only: the lane of one thread (or of the inline passes), made by its first pass
    (whose failure is then that pass's)."""
    made: list[Lane] = []

    def lane() -> Lane:
        if not made:
            made.append(make())
        return made[0]

    return lane
