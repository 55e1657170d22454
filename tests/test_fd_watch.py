"""FdWatch over real socket pairs, under asyncio and trio: readable, timed out, woken, closing, busy, cancelled.

Plain test functions that call ``anyio.run(..., backend=backend)``, as tests/transport/test_endpoint.py does:
pytest-asyncio's auto mode would claim ``async def`` tests for asyncio alone. Timings are only bounded from
below (a wait that ends too early is a bug). A wait that something else must end times out only after an hour, so
that when it returns it was ended by that; each test's deadline (``HANG``) fails one that never ends.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest

from acollect._runtime.fd_watch import FdWatch

LONG = 3600.0  # a wait's timeout when something else must end it: never reached by a test that passes
HANG = 30.0  # each test's deadline: only a wait that never ends misses it
Pair = tuple[socket.socket, socket.socket]


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "trio":
        pytest.importorskip("trio")
    return str(request.param)


@pytest.fixture
def pair() -> Iterator[Pair]:
    left, right = socket.socketpair()
    left.setblocking(False)
    yield left, right
    left.close()
    right.close()


def run(backend: str, main: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(HANG):
            return await main()

    return anyio.run(bounded, backend=backend)


async def until_waiting(watch: FdWatch) -> None:
    while not watch.waiting:  # noqa: ASYNC110 - the watch has no event to wait on; the test's deadline bounds this
        await anyio.sleep(0.001)


async def assert_unwatched(fd: int, backend: str) -> None:
    """Nothing waits on ``fd`` in the event loop's loans any more."""
    if backend == "asyncio":
        assert asyncio.get_running_loop().remove_reader(fd) is False
    else:  # trio lets one task wait per descriptor: a leftover waiter makes this raise BusyResourceError
        with anyio.move_on_after(0.01):
            await anyio.wait_readable(fd)


def test_returns_when_the_descriptor_turns_readable(backend: str, pair: Pair) -> None:
    left, right = pair

    async def main() -> None:
        watch = FdWatch(left.fileno())
        seen_waiting = []

        async def write_later() -> None:
            await anyio.sleep(0.05)
            seen_waiting.append(watch.waiting)
            right.send(b"x")

        async with anyio.create_task_group() as tg:
            tg.start_soon(write_later)
            start = time.monotonic()
            await watch.wait(LONG)
            elapsed = time.monotonic() - start
        assert seen_waiting == [True]
        assert elapsed >= 0.03
        assert not watch.waiting
        assert left.recv(8) == b"x"  # the wait looks, it does not read
        await assert_unwatched(left.fileno(), backend)
        right.send(b"y")  # readable before the wait: it returns at once
        await watch.wait(LONG)
        assert repr(watch) == f"FdWatch(fd={left.fileno()})"

    run(backend, main)


def test_returns_after_the_timeout_when_nothing_happens(backend: str, pair: Pair) -> None:
    left, _ = pair

    async def main() -> None:
        watch = FdWatch(left.fileno())
        for timeout in (0.2, 0.05):
            start = time.monotonic()
            await watch.wait(timeout)
            elapsed = time.monotonic() - start
            assert elapsed >= 0.8 * timeout, (timeout, elapsed)
            assert not watch.waiting
            await assert_unwatched(left.fileno(), backend)
        with pytest.raises(BlockingIOError):
            left.recv(8)

    run(backend, main)


def test_wake_from_another_task_ends_the_wait(backend: str, pair: Pair) -> None:
    left, _ = pair

    async def main() -> None:
        watch = FdWatch(left.fileno())
        watch.wake()  # nobody waits: nothing to end, and nothing remembered for the next wait
        start = time.monotonic()
        await watch.wait(0.1)
        assert time.monotonic() - start >= 0.08

        async def wake_later() -> None:
            await until_waiting(watch)
            assert repr(watch) == f"FdWatch(fd={left.fileno()}, waiting)"
            await anyio.sleep(0.02)
            watch.wake()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wake_later)
            await watch.wait(LONG)
        assert not watch.waiting
        await assert_unwatched(left.fileno(), backend)

    run(backend, main)


def test_closing_ends_the_wait_and_lets_go_of_the_descriptor(backend: str, pair: Pair) -> None:
    left, _ = pair

    async def main() -> None:
        fd = left.fileno()
        watch = FdWatch(fd)
        watch.closing()  # nobody waits: nothing to end, and the next wait waits
        start = time.monotonic()
        await watch.wait(0.1)
        assert time.monotonic() - start >= 0.08
        ended = []

        async def waiter() -> None:
            await watch.wait(LONG)
            ended.append(True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await until_waiting(watch)
            watch.closing()
            if backend == "asyncio":  # let go of at once, before the waiter runs again
                assert asyncio.get_running_loop().remove_reader(fd) is False
        assert ended == [True]
        assert not watch.waiting
        await assert_unwatched(fd, backend)
        left.close()
        # The number goes to the next descriptor opened, which a new watch must be able to wait on.
        reader, writer = socket.socketpair()
        with reader, writer:
            writer.send(b"x")
            await FdWatch(reader.fileno()).wait(LONG)

    run(backend, main)


def test_a_second_concurrent_wait_raises(backend: str, pair: Pair) -> None:
    left, right = pair

    async def main() -> None:
        watch = FdWatch(left.fileno())
        ended = []

        async def waiter() -> None:
            await watch.wait(LONG)
            ended.append(True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await until_waiting(watch)
            with pytest.raises(RuntimeError, match="another task waits on this descriptor already"):
                await watch.wait(LONG)
            await anyio.sleep(0.02)
            # The first wait goes on, still watching the descriptor.
            assert watch.waiting
            assert not ended
            right.send(b"x")
        assert ended == [True]
        assert not watch.waiting
        await watch.wait(0.01)

    run(backend, main)


@pytest.mark.parametrize("how", ["move_on_after", "task_cancelled"])
def test_outside_cancellation_passes_through(backend: str, how: str, pair: Pair) -> None:
    left, right = pair

    async def main() -> None:
        watch = FdWatch(left.fileno())
        outcome = []
        if how == "move_on_after":
            with anyio.move_on_after(0.05) as scope:
                await watch.wait(LONG)
                outcome.append("returned")
            assert scope.cancelled_caught
        else:

            async def waiter() -> None:
                try:
                    await watch.wait(LONG)
                    outcome.append("returned")
                except anyio.get_cancelled_exc_class():
                    outcome.append("cancelled")
                    raise

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await until_waiting(watch)
                tg.cancel_scope.cancel()
            assert outcome == ["cancelled"]
        assert "returned" not in outcome
        assert not watch.waiting
        await assert_unwatched(left.fileno(), backend)
        right.send(b"x")  # a new wait works, and sees the descriptor turn readable
        await watch.wait(LONG)
        assert not watch.waiting

    run(backend, main)


def test_a_wait_that_fails_to_start_leaves_the_watch_idle(backend: str) -> None:
    # The reader is registered before the watch counts as waiting: a refusal leaves nothing behind.
    async def main() -> None:
        with tempfile.TemporaryFile() as file:  # epoll refuses regular files (EPERM) under both backends
            watch = FdWatch(file.fileno())
            with pytest.raises(PermissionError):
                await watch.wait(0.05)
            assert not watch.waiting
            with pytest.raises(PermissionError):  # not RuntimeError: no other task waits
                await watch.wait(0.05)

    run(backend, main)
