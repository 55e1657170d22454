"""The lifecycle's one transition table: what it allows, and that docs/concepts.md shows it as it is.

To refresh the page after changing the table: ``python tests/test_lifecycle_table.py``.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import anyio
import pytest

from acollect import Collector
from acollect._runtime.lifecycle import (
    REASONS,
    TRANSITIONS,
    CollectorState,
    IllegalTransition,
    Lifecycle,
    transition_table_markdown,
)
from acollect.testing import CountingEnv, wait_until

CONCEPTS = Path(__file__).resolve().parents[1] / "docs" / "concepts.md"
_BLOCK = re.compile(r"(<!-- lifecycle-table:start[^\n]*-->\n)(.*?)(<!-- lifecycle-table:end -->)", re.S)
S = CollectorState


def render_page(page: str) -> str:
    """``page`` with the table between the markers regenerated."""
    match = _BLOCK.search(page)
    assert match is not None, "docs/concepts.md lost its lifecycle-table markers"
    return page[: match.start(2)] + transition_table_markdown() + page[match.end(2) :]


def test_docs_show_the_transition_table_as_it_is() -> None:
    page = CONCEPTS.read_text(encoding="utf-8")
    assert render_page(page) == page, (
        "docs/concepts.md's lifecycle table differs from TRANSITIONS: run `python tests/test_lifecycle_table.py`"
    )


def test_every_state_has_a_row_and_every_move_a_reason() -> None:
    assert set(TRANSITIONS) == set(CollectorState)
    assert {(a, b) for a, tos in TRANSITIONS.items() for b in tos} == set(REASONS)
    assert TRANSITIONS[S.CLOSED] == frozenset()
    # async_shutdown() works from every state: each one but CLOSING and CLOSED moves to CLOSING.
    assert all(S.CLOSING in tos for s, tos in TRANSITIONS.items() if s not in (S.CLOSING, S.CLOSED))


def test_a_move_the_table_does_not_list_raises_an_internal_error() -> None:
    machine = Lifecycle()
    with pytest.raises(IllegalTransition, match="from NEW to RUNNING"):
        machine.move(S.RUNNING)  # RUNNING means set up: only through STARTING
    assert machine.state is S.NEW
    with pytest.raises(IllegalTransition, match="BROKEN"):
        machine.move(S.STARTING, failure=RuntimeError("x"))  # only BROKEN carries a failure
    machine.move(S.STARTING)
    with pytest.raises(IllegalTransition):
        machine.move(S.BROKEN)  # BROKEN without its failure


def test_paused_is_derived_from_the_pause_count() -> None:
    machine = Lifecycle()
    machine.hold_pause()
    assert machine.state is S.NEW  # nothing set up: nothing to pause
    machine.move(S.STARTING)
    machine.setup_finished()
    assert machine.state is S.PAUSED
    assert not machine.pause_applied
    machine.hold_pause()
    machine.release_pause()
    assert machine.state is S.PAUSED
    machine.release_pause()
    assert machine.state is S.RUNNING
    assert machine.set_up


def test_broken_carries_its_failure_through_the_shutdown() -> None:
    machine = Lifecycle()
    machine.move(S.STARTING)
    machine.setup_undone()
    assert machine.state is S.NEW
    assert not machine.set_up
    machine.move(S.STARTING)
    machine.setup_finished()
    err = RuntimeError("worker died")
    machine.move(S.BROKEN, failure=err)
    assert machine.set_up
    assert machine.failure is err
    assert not machine.failure_reported
    assert machine.report_failure() is err
    assert machine.failure_reported
    machine.move(S.CLOSING)
    machine.move(S.CLOSED)
    assert machine.failure is err
    assert machine.closing
    assert not machine.set_up


if __name__ == "__main__":
    CONCEPTS.write_text(render_page(CONCEPTS.read_text(encoding="utf-8")), encoding="utf-8")
    sys.exit(0)


async def test_a_collector_is_starting_during_its_set_up_and_paused_after_it_if_a_pause_is_held() -> None:
    building, release = threading.Event(), threading.Event()

    def held_env() -> CountingEnv:
        building.set()  # built in a thread: the loop sees the set-up in progress until it is released
        release.wait(10)
        return CountingEnv(num_envs=2)

    collector = Collector(held_env, frames_per_batch=8, total_frames=16)
    seen: list[CollectorState] = []
    with anyio.fail_after(30):
        async with collector.pause():  # held before the set-up: NEW -> STARTING -> PAUSED
            async with anyio.create_task_group() as tg:
                tg.start_soon(collector.__aenter__)
                await wait_until(building.is_set)
                seen.append(collector.state)
                release.set()
            seen.append(collector.state)
        seen.append(collector.state)
        await collector.async_shutdown()
    assert seen == [S.STARTING, S.PAUSED, S.RUNNING]
    assert collector.state is S.CLOSED
