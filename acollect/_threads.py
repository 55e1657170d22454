"""Running blocking work off the event loop, in threads that never outlive the call.

anyio's worker threads cannot be interrupted: a cancelled ``to_thread.run_sync``
either abandons its thread (which keeps stepping envs in the background) or
makes the caller wait for the whole call. :func:`run_in_thread` instead hands
the work a :class:`threading.Event`; on cancellation it sets the event, waits
(shielded, with a deadline) for the work to notice, and only then lets the
cancellation through. Each call owns one short-lived thread, joined before
the call returns, so no acollect thread is left running afterwards.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["THREAD_NAME_PREFIX", "run_in_thread"]

T = TypeVar("T")

#: Every thread acollect starts has a name with this prefix (tests look for leftovers by it).
THREAD_NAME_PREFIX = "acollect-"


async def run_in_thread(
    fn: Callable[[threading.Event], T],
    *,
    name: str,
    cancel_timeout: float = 10.0,
) -> T:
    """Runs ``fn(stop_event)`` in a fresh thread and returns its result.

    Args:
        fn: blocking work; it should check ``stop_event`` often and return or raise soon after it is set.
        name: the thread's name (prefixed with ``"acollect-"``).
        cancel_timeout: on cancellation, how long to wait for ``fn`` to notice the stop event before
            giving up on it (the thread is then left to finish alone, and a warning is logged).

    Returns:
        What ``fn`` returned. Exceptions raised by ``fn`` propagate unchanged.

    Examples:
        >>> import anyio
        >>> anyio.run(lambda: run_in_thread(lambda stop: 41 + 1, name="doc"))
        42
    """
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(stop)
        except BaseException as exc:  # handed to the awaiting task as is
            outcome["error"] = exc
        finally:
            try:
                loop.call_soon_threadsafe(finished.set)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    thread = threading.Thread(target=target, name=THREAD_NAME_PREFIX + name, daemon=True)
    thread.start()
    try:
        await finished.wait()
    except BaseException:
        stop.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(cancel_timeout):
            await finished.wait()
        if finished.is_set():
            thread.join(1.0)  # the target already returned; this only waits for the thread to end
        else:
            import logging

            logging.getLogger("acollect").warning(
                "thread %s did not stop within %.1fs of cancellation; leaving it to finish", thread.name,
                cancel_timeout,
            )
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value
