"""The ``collect`` requests a lockstep collector sent one worker, and the parts that answered them.

A lockstep collector asks every worker for its part of each batch (a :class:`CollectRequest`), and takes a batch once
every live worker's part is in. A :class:`LockstepRequests` is that bookkeeping for one worker slot, a part of its
:class:`~acollect._workers.handles.WorkerHandle`: the requests not answered yet, oldest first (a successor is asked
them again), and the parts received and not taken yet. :class:`Received` is one batch as received, for every
collector.

Examples:
    >>> requests = LockstepRequests(0)
    >>> requests.on_ask(CollectRequest(1))
    >>> requests.on_ask(CollectRequest(2, ahead=True))
    >>> requests.asked(2), requests.asked(3), requests.outstanding
    (True, False, 2)
    >>> requests.answer({"n": 1})  # a batch answers the oldest request
    CollectRequest(number=1, slot=None, ahead=False)
    >>> requests.answer({"n": 3})
    Traceback (most recent call last):
    ...
    acollect.errors.ProtocolError: worker 0 answered collect n=3, asked for n=2
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDictBase

from acollect.errors import ProtocolError

__all__ = ["CollectRequest", "LockstepRequests", "Received"]


@dataclass
class CollectRequest:
    """One ``collect`` request to a worker (lockstep collectors): which batch its answer is a part of."""

    number: int  # the lockstep batch (numbered by the collector from 1, the same for every worker)
    slot: int | None = None  # the shared segment it names (a successor is asked again into the same rows)
    ahead: bool = False  # made before the caller asked for that batch (see Lockstep: such a part may be stale)

    def fields(self) -> dict[str, Any]:
        """The ``collect`` message's fields."""
        return {"n": self.number} if self.slot is None else {"n": self.number, "slot": self.slot}


@dataclass
class Received:
    """One batch as received: its header and data (views into a slot, or over message frames)."""

    worker: int
    generation: int
    header: dict[str, Any]
    data: TensorDictBase
    in_slot: bool
    nbytes: int = 0  # the batch's tensor bytes (as the worker's hello layout says)
    request: CollectRequest | None = None  # the ``collect`` it answers (lockstep collectors)


class LockstepRequests:
    """One worker's ``collect`` requests not answered yet, and its parts received and not taken yet.

    Args:
        worker: the worker's index (its errors name it).
    """

    __slots__ = ("_inbox", "_requests", "_worker")

    def __init__(self, worker: int) -> None:
        self._worker = worker
        self._requests: deque[CollectRequest] = deque()
        self._inbox: deque[Received] = deque()

    @property
    def requests(self) -> tuple[CollectRequest, ...]:
        """``collect`` requests not answered yet, oldest first."""
        return tuple(self._requests)

    @property
    def outstanding(self) -> int:
        """``collect`` requests not answered yet."""
        return len(self._requests)

    @property
    def inbox(self) -> tuple[Received, ...]:
        """Parts received and not taken yet (lockstep collectors), oldest first."""
        return tuple(self._inbox)

    def asked(self, number: int) -> bool:
        """Whether it was asked for its part of batch ``number`` (answered or not)."""
        return any(r.number == number for r in self._requests) or self.part(number) is not None

    def part(self, number: int) -> Received | None:
        """Its part of batch ``number``, if received and not taken yet."""
        return next((item for item in self._inbox if item.request is not None and item.request.number == number), None)

    def on_ask(self, request: CollectRequest) -> None:
        """The collector asks it for a part (sent now if ``READY``; a successor is asked again at its hello)."""
        self._requests.append(request)

    def take_part(self, number: int) -> Received:
        """Removes and returns its part of batch ``number`` (it must be there: see :meth:`part`)."""
        item = self.part(number)
        assert item is not None, f"worker {self._worker} has no part of batch {number}"
        self._inbox.remove(item)
        return item

    def answer(self, header: dict[str, Any]) -> CollectRequest:
        """A batch arrived: the oldest request, which it answers, is removed and returned.

        Raises:
            ProtocolError: nobody asked for it, or it answers another request.
        """
        if not self._requests:
            raise ProtocolError(f"worker {self._worker} sent a batch nobody asked for")
        number = header.get("n", self._requests[0].number)
        if number != self._requests[0].number:
            raise ProtocolError(
                f"worker {self._worker} answered collect n={number!r:.20}, asked for n={self._requests[0].number}"
            )
        return self._requests.popleft()

    def file(self, item: Received) -> None:
        """A part received (its request answered): it waits here until the collector takes it."""
        self._inbox.append(item)

    def on_new_incarnation(self) -> None:
        """A new process takes the slot: the requests its predecessor did not answer are asked again of it."""
        for request in self._requests:  # asked again of the successor, which begins them after every change
            request.ahead = False

    def on_lost(self) -> None:
        """The worker is dropped for good: nobody will answer its requests (a lockstep batch takes the live workers'
        parts), and its parts are not taken."""
        self._requests.clear()
        self._inbox.clear()

    def release(self) -> None:
        """The pool closed: the parts received are forgotten."""
        self._inbox.clear()
