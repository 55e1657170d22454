"""What a worker process is doing, as one state machine shared by its two threads.

The control thread (commands) and the runner thread (the env) of :mod:`acollect._workers.main` change the
state, always under the worker's lock, through :class:`LoopState`'s methods, each an event; the
moves are checked against :data:`WORKER_PROCESS` (the table ``docs/concepts.md`` shows). What the state
does not say is kept as data, not flags: how many batches the worker may send ahead (``credits``, once
``run`` came) and the one-shot requests it holds.

Examples:
    >>> state = LoopState()
    >>> state.built()
    >>> state.begin()
    >>> state.pause()       # the runner stops at its next step, keeping the batch
    >>> state.now
    <WorkerLoopState.PAUSED: 'paused'>
    >>> state.resume()
    >>> state.may_collect
    True
"""

from __future__ import annotations

import enum

from acollect._runtime.machine import StateTable

__all__ = ["WORKER_PROCESS", "LoopState", "WorkerLoopState"]


class WorkerLoopState(enum.Enum):
    """What a worker process is doing."""

    BUILDING = "building"
    IDLE = "idle"
    COLLECTING = "collecting"
    PAUSED = "paused"
    FAILED = "failed"
    STOPPING = "stopping"


_L = WorkerLoopState
WORKER_PROCESS: StateTable[WorkerLoopState] = StateTable(
    "worker process",
    {
        _L.BUILDING: "building its env and policy (then it says hello with its batch layout)",
        _L.IDLE: "waiting for work: a `collect` request, or a credit and a free slot (`run`)",
        _L.COLLECTING: "the runner thread steps a batch (heartbeats say `busy`: a hung env shows as busy with no "
        "steps)",
        _L.PAUSED: "a `pause` is held: the runner stopped at its next step and keeps the batch it was stepping, "
        "to continue it",
        _L.FAILED: "its env, policy or a command raised: the error (with its traceback) went to the collector, "
        "and it collects nothing more",
        _L.STOPPING: "`stop` came, or its collector is gone: the runner ends and the env is closed",
    },
    {
        (_L.BUILDING, _L.IDLE): "env and policy built, hello sent",
        (_L.BUILDING, _L.FAILED): "building raised",
        (_L.BUILDING, _L.STOPPING): "it ends before it was built",
        (_L.IDLE, _L.COLLECTING): "work came and a slot is free: the runner begins (or continues) a batch",
        (_L.IDLE, _L.PAUSED): "`pause`",
        (_L.IDLE, _L.FAILED): "a command raised",
        (_L.IDLE, _L.STOPPING): "`stop`, or its collector is gone",
        (_L.COLLECTING, _L.IDLE): "the batch was handed to ZeroMQ",
        (_L.COLLECTING, _L.PAUSED): "`pause`: the runner is interrupted at its next step",
        (_L.COLLECTING, _L.FAILED): "the env, the policy or a command raised",
        (_L.COLLECTING, _L.STOPPING): "`stop`, or its collector is gone: the runner is interrupted",
        (_L.PAUSED, _L.IDLE): "`resume`",
        (_L.PAUSED, _L.FAILED): "a command raised",
        (_L.PAUSED, _L.STOPPING): "`stop`, or its collector is gone",
        (_L.FAILED, _L.STOPPING): "`stop`, or its collector is gone",
    },
)


class LoopState:
    """One worker process's :class:`WorkerLoopState`; every method is an event (call them holding the worker's
    lock: two threads share it)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = WorkerLoopState.BUILDING

    def _move(self, to: WorkerLoopState) -> None:
        self._state = WORKER_PROCESS.move(self._state, to)

    @property
    def now(self) -> WorkerLoopState:
        """The current state."""
        return self._state

    @property
    def may_collect(self) -> bool:
        """Whether the runner may begin (or continue) a batch: built, not paused, failed or stopping."""
        return self._state in (WorkerLoopState.IDLE, WorkerLoopState.COLLECTING)

    @property
    def collecting(self) -> bool:
        """Whether the runner steps a batch (what heartbeats call ``busy``)."""
        return self._state is WorkerLoopState.COLLECTING

    @property
    def stopping(self) -> bool:
        """Whether it ends."""
        return self._state is WorkerLoopState.STOPPING

    def built(self) -> None:
        """Env and policy built; hello sent."""
        self._move(WorkerLoopState.IDLE)

    def begin(self) -> None:
        """The runner begins (or continues) a batch."""
        self._move(WorkerLoopState.COLLECTING)

    def batch_done(self) -> None:
        """The runner handed its batch over (or was interrupted by a pause, a stop or a failure meanwhile)."""
        if self._state is WorkerLoopState.COLLECTING:
            self._move(WorkerLoopState.IDLE)

    def pause(self) -> None:
        """``pause`` came (once built, and while it can still collect)."""
        if self.may_collect:
            self._move(WorkerLoopState.PAUSED)

    def resume(self) -> None:
        """``resume`` came."""
        if self._state is WorkerLoopState.PAUSED:
            self._move(WorkerLoopState.IDLE)

    def fail(self) -> None:
        """Something raised and was reported: it collects nothing more."""
        if self._state not in (WorkerLoopState.FAILED, WorkerLoopState.STOPPING):
            self._move(WorkerLoopState.FAILED)

    def stop(self) -> None:
        """It ends (idempotent)."""
        if self._state is not WorkerLoopState.STOPPING:
            self._move(WorkerLoopState.STOPPING)
