"""Every state machine's one table: complete, shown in the docs as it is, and the only way its state moves.

To refresh the page after changing a table: ``python tests/test_state_tables.py``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from acollect._runtime.lifecycle import LIFECYCLE
from acollect._runtime.machine import IllegalTransition, StateTable
from acollect._workers.batch_sequence import BatchSequence
from acollect._workers.handles import WORKER, WorkerHandle, WorkerState
from acollect._workers.heartbeats import Heartbeats
from acollect._workers.lockstep_requests import LockstepRequests
from acollect._workers.pool_events import POOL, PoolEvents, PoolState
from acollect._workers.protocol import WorkerConfig
from acollect._workers.state import WORKER_PROCESS, LoopState, WorkerLoopState
from acollect._workers.worker_commands import WorkerCommands
from acollect._workers.worker_memory import WorkerMemory

ROOT = Path(__file__).resolve().parents[1]
#: marker name -> its table and the page that shows it (the collector lifecycle keeps its own markers:
#: test_lifecycle_table). A user reads the workers' states (collector.worker_states); the others are internals.
TABLES: dict[str, tuple[StateTable, Path]] = {
    "worker": (WORKER, ROOT / "docs" / "concepts.md"),
    "worker-pool": (POOL, ROOT / "docs" / "architecture.md"),
    "worker-process": (WORKER_PROCESS, ROOT / "docs" / "architecture.md"),
}


def render_page(page: str, path: Path) -> str:
    """``page`` (the text of ``path``) with every table it shows regenerated between its markers."""
    for name, (table, where) in TABLES.items():
        if where != path:
            continue
        block = re.compile(rf"(<!-- state-table:{name}:start[^\n]*-->\n)(.*?)(<!-- state-table:{name}:end -->)", re.S)
        match = block.search(page)
        assert match is not None, f"{path.name} lost its state-table:{name} markers"
        page = page[: match.start(2)] + table.markdown() + page[match.end(2) :]
    return page


@pytest.mark.parametrize("path", sorted({where for _, where in TABLES.values()}), ids=lambda p: p.name)
def test_docs_show_every_table_as_it_is(path: Path) -> None:
    page = path.read_text(encoding="utf-8")
    assert render_page(page, path) == page, (
        f"{path.name}'s state tables differ: run `python tests/test_state_tables.py`"
    )


@pytest.mark.parametrize("table", [LIFECYCLE, *(table for table, _ in TABLES.values())], ids=lambda t: t.name)
def test_every_state_means_something_and_every_one_but_the_last_can_end(table: StateTable) -> None:
    assert set(table.meanings) == set(table.states)
    finals = [s for s in table.states if not table.transitions[s]]
    assert len(finals) == 1, f"the {table.name} has one final state, not {finals}"
    # From every state the final one is reachable: nothing is stuck forever.
    for state in table.states:
        seen, frontier = {state}, [state]
        while frontier:
            frontier = [t for s in frontier for t in table.transitions[s] if t not in seen]
            seen.update(frontier)
        assert finals[0] in seen, f"the {table.name} cannot end from {state.name}"


def test_moves_the_tables_do_not_list_raise() -> None:
    handle = WorkerHandle(0, WorkerConfig(0, 0, 1, "", 0, None))
    with pytest.raises(IllegalTransition, match="worker cannot move from NEW to READY"):
        handle.on_greeted(0.0)  # a hello comes from a started worker only
    handle.on_stopping()
    with pytest.raises(IllegalTransition, match="from STOPPING to STARTING"):
        handle.on_launch(0.0)  # nothing restarts in a closing pool
    events = PoolEvents()
    with pytest.raises(IllegalTransition, match="worker pool cannot move from NEW to CLOSED"):
        events.closed_all()
    loop = LoopState()
    with pytest.raises(IllegalTransition, match="worker process cannot move from BUILDING to COLLECTING"):
        loop.begin()


def test_a_worker_slot_lives_through_a_restart_and_a_stop() -> None:
    handle = WorkerHandle(0, WorkerConfig(0, 0, 1, "", 0, None))
    handle.on_launch(1.0)
    handle.on_hello({"n_envs": 2, "frames_per_batch": 8, "layout": {"leaves": [{"nbytes": 64}]}})
    handle.on_greeted(2.0)
    assert (
        handle.state,
        handle.generation,
        handle.hello.n_envs,
        handle.hello.batch_nbytes,
    ) == (WorkerState.READY, 1, 2, 64)
    assert handle.on_unreachable(3.0)
    assert not handle.on_unreachable(3.5)  # noticed once
    assert handle.state is WorkerState.UNREACHABLE
    assert handle.on_death(lockstep=False, running=True) == 0
    handle.on_launch(4.0)
    assert (handle.state, handle.generation, handle.restarts, handle.unreachable_since) == (
        WorkerState.STARTING,
        2,
        1,
        None,
    )
    handle.on_stopping()
    assert handle.state is WorkerState.STOPPING


def test_a_pool_breaks_once_and_closes_once() -> None:
    failures: list[BaseException] = []
    events = PoolEvents(failures.append)
    events.starting()
    events.fail(RuntimeError("first"))
    events.fail(RuntimeError("second"))
    assert events.state is PoolState.BROKEN
    assert [str(f) for f in failures] == ["first"]
    assert events.closing()
    assert not events.closing()
    events.fail(RuntimeError("while closing: nobody's news"))
    events.closed_all()
    assert (events.state, str(events.failure)) == (PoolState.CLOSED, "first")


def test_a_worker_process_pauses_and_fails_by_its_table() -> None:
    loop = LoopState()
    loop.built()
    loop.begin()
    loop.pause()
    assert loop.now is WorkerLoopState.PAUSED
    loop.batch_done()  # the runner noticed the pause: it holds the batch
    assert not loop.may_collect
    loop.resume()
    assert loop.may_collect
    loop.fail()
    loop.resume()  # a failed worker stays failed
    assert loop.now is WorkerLoopState.FAILED
    loop.stop()
    assert loop.stopping


# -- one owner per state ------------------------------------------------------------------------------------


def _writes_of_other_objects_private_attributes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]:
            if isinstance(target, ast.Attribute) and target.attr.startswith("_") and not target.attr.startswith("__"):
                owner = target.value
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_no_module_writes_another_objects_private_fields() -> None:
    modules = sorted((ROOT / "acollect").rglob("*.py"))
    found = [w for path in modules for w in _writes_of_other_objects_private_attributes(path)]
    assert not found, "an object's fields are written by its own methods only:\n" + "\n".join(found)


#: Each stateful object (a worker handle's parts too), and how to make one.
STATEFUL: dict[type, Callable[[], object]] = {
    WorkerHandle: lambda: WorkerHandle(0, WorkerConfig(0, 0, 1, "", 0, None)),
    LoopState: LoopState,
    Heartbeats: lambda: Heartbeats(0),
    BatchSequence: lambda: BatchSequence(0),
    LockstepRequests: lambda: LockstepRequests(0),
    WorkerMemory: WorkerMemory,
    WorkerCommands: WorkerCommands,
}


@pytest.mark.parametrize("owner", list(STATEFUL), ids=lambda owner: owner.__name__)
def test_a_stateful_objects_fields_are_private_and_its_public_names_read_only(owner: type) -> None:
    # With every field private (no module writes another object's private field: the test above) and every public
    # name a read-only property or a method, only the object's own methods can change it.
    assert all(name.startswith("_") for name in owner.__slots__), owner.__slots__
    instance = STATEFUL[owner]()
    for name in dir(owner):
        if name.startswith("_") or callable(getattr(owner, name)):
            continue
        with pytest.raises(AttributeError):
            setattr(instance, name, getattr(instance, name))


if __name__ == "__main__":
    for page_path in {where for _, where in TABLES.values()}:
        page_path.write_text(render_page(page_path.read_text(encoding="utf-8"), page_path), encoding="utf-8")
    sys.exit(0)


async def test_a_killed_worker_is_restarted_through_starting_and_is_ready_again() -> None:
    import os
    import signal

    import anyio

    from acollect import MultiSyncCollector
    from acollect.testing import CountingEnv, wait_until

    assert MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8).worker_states == [None, None]
    with anyio.fail_after(60):
        async with MultiSyncCollector(
            [CountingEnv] * 2, frames_per_batch=8, max_worker_restarts=1, start_method="forkserver"
        ) as collector:
            assert collector.worker_states == [WorkerState.READY, WorkerState.READY]
            victim = collector.worker_pids[0]
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            seen: set[WorkerState | None] = set()

            def restarted() -> bool:
                seen.add(collector.worker_states[0])
                return collector.worker_pids[0] != victim and collector.worker_states[0] is WorkerState.READY

            await wait_until(restarted, timeout=30, interval=0.005)
            assert WorkerState.STARTING in seen
            assert (await anext(collector)).shape[0] == 2
