"""Running blocking work off the event loop, in threads that never outlive the call.

anyio's worker threads cannot be interrupted: a cancelled ``to_thread.run_sync``
either abandons its thread (which keeps stepping envs in the background) or
makes the caller wait for the whole call. :func:`run_in_thread` instead hands
the work a :class:`threading.Event`; on cancellation it sets the event, waits
(shielded, with a deadline) for the work to notice, and only then lets the
cancellation through. Each call owns one short-lived thread, joined before
the call returns, so no acollect thread is left running afterwards.

It runs under any backend anyio supports (asyncio and trio): the thread wakes
the awaiting task by writing one byte to a socket pair the task waits on with
:func:`anyio.wait_readable`. That write never blocks and needs no event loop, so
a thread that outlives its caller (see ``cancel_timeout``) finishes alone even
after the event loop has stopped or closed; a callback scheduled into the loop
(``anyio.from_thread.run_sync``) would instead block the thread until the loop
ran it, which a stopped loop never does. Socket pairs (not pipes) because
``wait_readable`` takes only sockets on Windows; they are reused from call to
call, since creating and closing one costs about as much as the rest of a call.

:class:`GilHandover` is what a collection thread calls between two env steps so that the event
loop, sharing its GIL, never waits long for it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from acollect._warnings import KeptWarnings, emit

__all__ = ["THREAD_NAME_PREFIX", "GilHandover", "run_in_thread", "yield_gil"]

T = TypeVar("T")

#: Every thread acollect starts has a name with this prefix (tests look for leftovers by it).
THREAD_NAME_PREFIX = "acollect-"

# Linux would raise SIGPIPE on a write to a pair whose reader is gone; the flag turns it into EPIPE.
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)

# Drained (empty) socket pairs ready for the next call: (read end, non-blocking; write end).
_idle_pairs: list[tuple[socket.socket, socket.socket]] = []
_MAX_IDLE_PAIRS = 8


def _take_pair() -> tuple[socket.socket, socket.socket]:
    try:
        return _idle_pairs.pop()
    except IndexError:
        wakeup, notify = socket.socketpair()
        wakeup.setblocking(False)
        return wakeup, notify


def _give_back(pair: tuple[socket.socket, socket.socket]) -> None:
    if len(_idle_pairs) < _MAX_IDLE_PAIRS:
        _idle_pairs.append(pair)
    else:
        for sock in pair:
            sock.close()


def _close_idle_pairs() -> None:
    # A forked child must not share wake-up sockets with its parent.
    while _idle_pairs:
        for sock in _idle_pairs.pop():
            sock.close()


atexit.register(_close_idle_pairs)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_idle_pairs)


#: The offer :class:`GilHandover` makes: drops the GIL around a system call that yields the CPU (about half a
#: microsecond when no thread waits for it). Looked up at each offer, so a test can count the offers by replacing it.
yield_gil: Callable[[], object] = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


class GilHandover:
    """Offers the GIL to a thread waiting for it (the event loop), when called at most every ``interval`` seconds.

    A thread that wants the GIL waits up to the switch interval (5 ms) and then asks the holder to drop
    it; but every time the holder drops and takes it back on its own (each torch op does), the waiter's
    wait starts again, so an event loop beside a collection thread can wait many intervals. Called between
    two env steps, this drops the GIL and yields the CPU (``os.sched_yield``), which lets a waiting loop
    take it: each time the loop wants the GIL it then waits about ``interval`` plus one step, not several
    switch intervals (a hand-over, not a guarantee: the scheduler decides who runs). It changes nothing
    for other threads or for the process's switch interval. The price is the GIL's share: a loop that
    keeps the GIL busy (a trainer sampling in a tight loop) gets more of it, and collection less.

    Args:
        interval: the least time between two offers; 0 offers at every call.

    Examples:
        >>> handover = GilHandover(0.001)
        >>> for _ in range(3):
        ...     handover()  # between two env steps; a waiting event loop takes the GIL here
        >>> handover.offers >= 1
        True
    """

    __slots__ = ("_last", "interval", "offers")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        #: how many times the GIL was offered
        self.offers = 0
        self._last = -math.inf

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._last >= self.interval:
            yield_gil()
            self.offers += 1
            self._last = time.perf_counter()


async def run_in_thread(
    fn: Callable[[threading.Event], T],
    *,
    name: str,
    cancel_timeout: float = 10.0,
) -> T:
    """Runs ``fn(stop_event)`` in a fresh thread and returns its result.

    Works under asyncio and trio alike (through anyio).

    Args:
        fn: blocking work; it should check ``stop_event`` often and return or raise soon after it is set.
        name: the thread's name (prefixed with ``"acollect-"``).
        cancel_timeout: on cancellation, how long to wait for ``fn`` to notice the stop event before
            giving up on it (the thread is then left to finish alone, and a warning is logged).

    Returns:
        What ``fn`` returned. Exceptions raised by ``fn`` propagate unchanged; acollect's own warnings
        (:func:`acollect._warnings.warn`) raised by ``fn`` are emitted here, by the awaiting task, so they
        point at the user's line.

    Examples:
        >>> import anyio
        >>> anyio.run(lambda: run_in_thread(lambda stop: 41 + 1, name="doc"))
        42
        >>> anyio.run(lambda: run_in_thread(lambda stop: 41 + 1, name="doc"), backend="trio")
        42
    """
    stop = threading.Event()
    outcome: dict[str, Any] = {}
    # acollect's warnings raised in the thread are emitted from here, where the user's frames are above.
    kept = KeptWarnings()
    wakeup, notify = pair = _take_pair()
    # Whether the thread wrote its byte, and whether the task gave up on it: decided under the lock,
    # so that exactly one side closes ``notify`` when the task leaves first, and nobody writes to a
    # socket that was closed (and whose descriptor may already be someone else's).
    lock = threading.Lock()
    state = {"notified": False, "abandoned": False}

    def target() -> None:
        try:
            with kept:
                outcome["value"] = fn(stop)
        except BaseException as exc:  # handed to the awaiting task as is
            outcome["error"] = exc
        finally:
            with lock:
                if not state["abandoned"]:
                    # Never blocks: the pair is empty. The byte makes ``wakeup`` readable.
                    notify.send(b"\0", _NOSIGNAL)
                    state["notified"] = True
            if state["abandoned"]:
                notify.close()  # the task closed its end and forgot the pair

    thread = threading.Thread(target=target, name=THREAD_NAME_PREFIX + name, daemon=True)
    try:
        thread.start()
    except BaseException:
        _give_back(pair)
        raise
    try:
        await anyio.wait_readable(wakeup)
    except BaseException:
        stop.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(cancel_timeout):
            await anyio.wait_readable(wakeup)
        with lock:
            if not state["notified"]:
                state["abandoned"] = True
        if state["abandoned"]:
            wakeup.close()
            logging.getLogger("acollect").warning(
                "thread %s did not stop within %.1fs of cancellation; leaving it to finish",
                thread.name,
                cancel_timeout,
            )
        else:
            wakeup.recv(16)
            _give_back(pair)
            thread.join(1.0)  # the target already returned; this only waits for the thread to end
        raise
    wakeup.recv(16)
    _give_back(pair)
    thread.join()
    if "error" in outcome:
        with contextlib.suppress(Warning):  # under -W error a warning must not hide the error itself
            emit(kept.kept)
        raise outcome["error"]
    emit(kept.kept)
    value: T = outcome["value"]
    return value
