"""A lockstep ask takes the push order's lock without a trip through the event loop when the lock is free.

Beside a trainer that computes between its awaits, each trip through the loop costs a whole trainer step, and the ask
for a worker's next part waited that long (docs/background.md, "Cores for the trainer"). A held lock is still waited
for, so a weight push and the requests of a batch never interleave.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from acollect.collectors._dispatch import _held

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_free_lock_is_taken_without_letting_another_task_run() -> None:
    lock, turns = anyio.Lock(), 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        await anyio.lowlevel.checkpoint()  # the other task runs once, and waits for its next turn
        before = turns
        async with _held(lock):
            assert lock.locked()
            assert turns == before  # taken in this turn: the other task did not run
        assert not lock.locked()
        tg.cancel_scope.cancel()


async def test_a_held_lock_is_waited_for() -> None:
    lock, order = anyio.Lock(), []

    async def holder(task_status: anyio.abc.TaskStatus[None]) -> None:
        async with lock:
            task_status.started()
            await anyio.sleep(0.05)
            order.append("holder done")

    async with anyio.create_task_group() as tg:
        await tg.start(holder)
        async with _held(lock):
            order.append("asker in")
    assert order == ["holder done", "asker in"]
