"""run_in_thread under asyncio and trio: results, errors, cancellation, and no thread left behind.

Plain test functions that call ``anyio.run(..., backend=backend)``: pytest-asyncio's auto mode
would claim ``async def`` tests for asyncio only, and anyio's own pytest plugin would then fight it
over the same functions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from acollect._runtime.threads import THREAD_NAME_PREFIX, GilHandover, run_in_thread


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(backend: str, main: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(main, backend=backend)


def acollect_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX) and t.is_alive()]


def test_returns_the_result_from_a_fresh_named_thread(backend: str) -> None:
    seen: list[threading.Thread] = []

    def work(stop: threading.Event) -> int:
        seen.append(threading.current_thread())
        return 42

    async def main() -> list[int]:
        return [await run_in_thread(work, name="answer") for _ in range(3)]

    assert run(backend, main) == [42, 42, 42]
    assert [t.name for t in seen] == ["acollect-answer"] * 3
    assert len({id(t) for t in seen}) == 3
    assert threading.main_thread() not in seen
    assert not any(t.is_alive() for t in seen)  # joined before the call returned
    assert not acollect_threads()


def test_exceptions_propagate_unchanged(backend: str) -> None:
    error = ValueError("bad env")

    def work(stop: threading.Event) -> None:
        raise error

    async def main() -> None:
        await run_in_thread(work, name="fails")

    with pytest.raises(ValueError, match="bad env") as info:
        run(backend, main)
    assert info.value is error
    assert not acollect_threads()


def test_cancellation_sets_the_stop_event_waits_and_is_reraised(backend: str) -> None:
    stopped_after: list[float] = []

    def work(stop: threading.Event) -> str:
        start = time.monotonic()
        assert stop.wait(30)
        time.sleep(0.05)  # the caller waits for this too
        stopped_after.append(time.monotonic() - start)
        return "unused"

    async def main() -> tuple[bool, bool]:
        reraised = False
        with anyio.move_on_after(0.1) as scope:
            try:
                await run_in_thread(work, name="cancelled")
            except anyio.get_cancelled_exc_class():
                reraised = True
                raise
        return scope.cancelled_caught, reraised

    assert run(backend, main) == (True, True)
    assert len(stopped_after) == 1  # the work returned before run_in_thread let the cancellation through
    assert not acollect_threads()


def test_cancellation_after_the_work_finished_still_returns_no_thread(backend: str) -> None:
    async def main() -> None:
        for delay in (0.0, 0.001, 0.002, 0.005):
            with anyio.move_on_after(delay):
                await run_in_thread(lambda stop: time.sleep(0.002), name="race")
            assert not acollect_threads()

    run(backend, main)


def test_a_thread_ignoring_the_stop_event_is_left_with_a_warning(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    def stubborn(stop: threading.Event) -> None:
        release.wait(60)

    async def main() -> float:
        start = time.monotonic()
        with anyio.move_on_after(0.05):
            await run_in_thread(stubborn, name="stubborn", cancel_timeout=0.1)
        return time.monotonic() - start

    with caplog.at_level(logging.WARNING, logger="acollect"):
        elapsed = run(backend, main)  # the event loop has ended; the thread is still running
    assert elapsed < 30  # left at its cancel_timeout, not waited for (60 s)
    assert "acollect-stubborn did not stop within 0.1s" in caplog.text
    (thread,) = acollect_threads()
    release.set()
    thread.join(5)  # it finishes alone, though nobody waits for it and its event loop is gone
    assert not thread.is_alive()


def test_many_concurrent_calls(backend: str) -> None:
    async def main() -> list[int]:
        results = [0] * 20

        async def one(i: int) -> None:
            results[i] = await run_in_thread(lambda stop: (time.sleep(0.01), i)[1], name=f"n{i}")

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        return results

    assert run(backend, main) == list(range(20))
    assert not acollect_threads()


def test_gil_handover_offers_at_most_every_interval() -> None:
    every_call, once = GilHandover(0.0), GilHandover(float("inf"))
    for _ in range(5):
        every_call()
        once()
    assert every_call.offers == 5
    assert once.offers == 1  # the first call offers: nothing says when the GIL was last given up
