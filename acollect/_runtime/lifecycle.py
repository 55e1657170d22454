"""The collector lifecycle as one state machine: the states, the table of allowed moves, one way to move.

Every change of a collector's state goes through :meth:`Lifecycle.move`, which checks it against
:data:`TRANSITIONS` and raises :class:`IllegalTransition` (a bug in acollect, never a user error) on a
move the table does not list. What the state depends on lives here too, nowhere else:

* the failure that broke the collector (:attr:`Lifecycle.failure`, kept after the shutdown, so a
  background failure can still be reported) and whether it was reported;
* the pause count: a pause held while the collector is set up makes it ``PAUSED`` (the state is
  derived from the count, never set beside it), and whether whatever collects was told so;
* background mode (``start()`` was called).

A collector's states and their moves (as the table below lists them)::

                 ┌──────── set-up cancelled or failed: torn down, usable again ─────────┐
                 ▼                                                                      │
                NEW ──(async with / first batch / start() / a weight push)──▶ STARTING ─┤
                                                                                        │ set-up done:
                            ┌─── pause count > 0 ───┐                                   │ a pause held?
                 RUNNING ◀──┘                       └──▶ PAUSED  ◀──── yes ─────────────┤
                    ▲ └──────── pause count 0 ◀─────────────┘                           │
                    └─────────────────────────────────────────────────────── no ────────┘

    NEW (start()'s set-up failed), STARTING, RUNNING, PAUSED ──(a task, a worker, an env failed)──▶ BROKEN
    every state but CLOSING and CLOSED ──(async_shutdown())──▶ CLOSING ──(everything released)──▶ CLOSED

The table, rendered by :func:`transition_table_markdown`, is the one in ``docs/concepts.md``
(a test regenerates it and fails if the page differs):

>>> sorted(s.name for s in TRANSITIONS[CollectorState.NEW])
['BROKEN', 'CLOSING', 'STARTING']
>>> machine = Lifecycle()
>>> machine.move(CollectorState.STARTING)
>>> machine.hold_pause()
>>> machine.setup_finished()
>>> machine.state
<CollectorState.PAUSED: 'paused'>
>>> try:
...     machine.move(CollectorState.NEW)
... except IllegalTransition as exc:
...     print(exc)  # doctest: +ELLIPSIS
internal error: ... cannot move from PAUSED to NEW (allowed: BROKEN, CLOSING, RUNNING); this is a bug...
"""

from __future__ import annotations

import dataclasses
import enum

import anyio

from acollect._runtime.machine import IllegalTransition, StateTable

__all__ = [
    "LIFECYCLE",
    "TRANSITIONS",
    "CloseReason",
    "CollectorState",
    "IllegalTransition",
    "Lifecycle",
    "transition_table_markdown",
]


class CollectorState(enum.Enum):
    """Where a collector is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    CLOSING = "closing"
    CLOSED = "closed"
    BROKEN = "broken"


_S = CollectorState


class CloseReason(enum.Enum):
    """Why a collector closed: what a call on a closed collector says."""

    SHUTDOWN = "async_shutdown() was called"
    ASYNC_WITH = "its `async with` block ended"
    EXHAUSTED = "it collected its total_frames and shut itself down"
    LOOP_ENDED = "the event loop it started on ended while it was open"


#: What each state means (one line each; the Markdown table shows them).
MEANINGS: dict[CollectorState, str] = {
    _S.NEW: "built and checked; no env built, nothing running yet (also after a set-up that was cancelled or "
    "failed: it was torn down, and the next call starts afresh)",
    _S.STARTING: "set-up in progress (on `async with`, the first batch, `start()` or a weight push): envs, "
    "policies and workers are being built",
    _S.RUNNING: "set up: envs built, batches flowing",
    _S.PAUSED: "set up, and a `pause()` block is held (by any task): nothing is collected",
    _S.BROKEN: "something other than you broke it: a worker died or hung, an env or the policy raised, the "
    "background task failed. Every call raises that failure until `async_shutdown()`",
    _S.CLOSING: "`async_shutdown()` is stopping tasks, threads and workers",
    _S.CLOSED: "everything the collector owned is released",
}

#: Why each move happens (the Markdown table shows them).
REASONS: dict[tuple[CollectorState, CollectorState], str] = {
    (_S.NEW, _S.STARTING): "`async with`, the first batch, `start()` or a weight push begins the set-up",
    (_S.NEW, _S.BROKEN): "the task of `start()` failed its set-up, torn down already",
    (_S.NEW, _S.CLOSING): "`async_shutdown()`",
    (_S.STARTING, _S.RUNNING): "set-up done, no pause held",
    (_S.STARTING, _S.PAUSED): "set-up done while a pause is held",
    (_S.STARTING, _S.NEW): "set-up cancelled or failed: torn down, usable again",
    (_S.STARTING, _S.BROKEN): "a task or a worker failed during set-up",
    (_S.STARTING, _S.CLOSING): "`async_shutdown()`, which cancels the set-up",
    (_S.RUNNING, _S.PAUSED): "the first pause is entered",
    (_S.RUNNING, _S.BROKEN): "a task, a worker, an env or the policy failed",
    (_S.RUNNING, _S.CLOSING): "`async_shutdown()`",
    (_S.PAUSED, _S.RUNNING): "the last pause is left",
    (_S.PAUSED, _S.BROKEN): "a task or a worker failed",
    (_S.PAUSED, _S.CLOSING): "`async_shutdown()`",
    (_S.BROKEN, _S.CLOSING): "`async_shutdown()`",
    (_S.CLOSING, _S.CLOSED): "everything released",
}


#: The lifecycle's table: every move goes through it (:meth:`Lifecycle.move`).
LIFECYCLE = StateTable("collector lifecycle", MEANINGS, REASONS)

#: Every allowed move, state -> the states it may move to (derived from :data:`REASONS`). Anything else is a bug.
TRANSITIONS = LIFECYCLE.transitions


def transition_table_markdown() -> str:
    """Renders the lifecycle's table (with what each state means and why each move happens) as Markdown."""
    return LIFECYCLE.markdown()


@dataclasses.dataclass(frozen=True)
class _Failure:
    """What broke a collector, and what is known of it (replaced, never changed in place)."""

    error: BaseException
    #: whether its set-up had finished when it broke, or finished since: what collects exists and is torn down
    set_up: bool
    #: whether it was raised to the user already (a failure is raised at least once, never lost)
    reported: bool = False


class _Use(enum.Flag):
    """How a collector's life is owned, each marked once and for good: the caller's ``async with`` (its end shuts
    the collector down, not the end of its frames), and ``start()`` (it fills a replay buffer, never yields)."""

    ASYNC_WITH = enum.auto()
    BACKGROUND = enum.auto()


class Lifecycle:
    """One collector's state and what it depends on; every change goes through :meth:`move`."""

    __slots__ = ("_close_reason", "_closed", "_collecting", "_failure", "_pauses", "_state", "_uses")

    def __init__(self) -> None:
        self._state = CollectorState.NEW
        self._failure: _Failure | None = None
        self._pauses = 0
        # The state whatever collects was last brought to (RUNNING or PAUSED): it follows the pause count, late.
        self._collecting = CollectorState.RUNNING
        self._uses = _Use(0)
        self._close_reason: CloseReason | None = None
        self._closed = anyio.Event()

    # -- the one transition function ---------------------------------------------------
    def move(
        self, to: CollectorState, *, failure: BaseException | None = None, reason: CloseReason = CloseReason.SHUTDOWN
    ) -> None:
        """Moves to ``to``; raises :class:`IllegalTransition` if :data:`TRANSITIONS` does not allow it.

        A move to ``BROKEN`` carries its failure (and only that move does); a move to ``CLOSING`` says why.
        """
        LIFECYCLE.move(self._state, to)
        if (to is CollectorState.BROKEN) != (failure is not None):
            raise IllegalTransition(
                f"internal error: a move to {to.name} with failure={failure!r} (a move to BROKEN, and only that "
                "move, carries the failure); this is a bug in acollect"
            )
        if failure is not None:
            self._failure = _Failure(failure, set_up=self._state in (CollectorState.RUNNING, CollectorState.PAUSED))
        self._state = to
        if to is CollectorState.CLOSING:
            self._close_reason = reason
        if to is CollectorState.CLOSED:
            self._closed.set()

    # -- reading -------------------------------------------------------------------------
    @property
    def state(self) -> CollectorState:
        """The current state."""
        return self._state

    @property
    def closing(self) -> bool:
        """``CLOSING`` or ``CLOSED``: ``async_shutdown()`` was called."""
        return self._state in (CollectorState.CLOSING, CollectorState.CLOSED)

    @property
    def close_reason(self) -> CloseReason | None:
        """Why it closed (``None`` while it is not ``CLOSING`` or ``CLOSED``)."""
        return self._close_reason

    @property
    def set_up(self) -> bool:
        """Whether the set-up finished (and was not torn down by a shutdown): what collects exists."""
        if self._state is CollectorState.BROKEN:
            assert self._failure is not None
            return self._failure.set_up
        return self._state in (CollectorState.RUNNING, CollectorState.PAUSED)

    @property
    def failure(self) -> BaseException | None:
        """What broke the collector (the first failure only), kept after the shutdown; ``None`` if nothing did."""
        return self._failure.error if self._failure is not None else None

    @property
    def failure_reported(self) -> bool:
        """Whether :attr:`failure` was raised to the user already."""
        return self._failure is not None and self._failure.reported

    def report_failure(self) -> BaseException:
        """Returns :attr:`failure`, marked as reported (a failure is raised at least once, never lost)."""
        assert self._failure is not None
        self._failure = dataclasses.replace(self._failure, reported=True)
        return self._failure.error

    async def wait_closed(self) -> None:
        """Returns once the state is ``CLOSED``."""
        await self._closed.wait()

    # -- set-up ----------------------------------------------------------------------------
    def setup_finished(self) -> None:
        """The set-up ended well: ``RUNNING``, or ``PAUSED`` if a pause is held (or, if it broke meanwhile, noted)."""
        if self._state is CollectorState.STARTING:
            self.move(CollectorState.PAUSED if self._pauses else CollectorState.RUNNING)
        elif self._state is CollectorState.BROKEN:
            assert self._failure is not None
            self._failure = dataclasses.replace(self._failure, set_up=True)

    def setup_undone(self) -> None:
        """The set-up was cancelled or failed and torn down: ``NEW`` again, unless it broke or closes meanwhile."""
        if self._state is CollectorState.STARTING:
            self.move(CollectorState.NEW)

    # -- pauses ------------------------------------------------------------------------------
    @property
    def pauses(self) -> int:
        """How many ``pause()`` blocks are held."""
        return self._pauses

    @property
    def pause_applied(self) -> bool:
        """Whether whatever collects was last told to pause (``True``) or to go on (``False``)."""
        return self._collecting is CollectorState.PAUSED

    def pause_was_applied(self, paused: bool) -> None:
        """Notes that whatever collects was told to pause (``True``) or to go on (``False``)."""
        self._collecting = CollectorState.PAUSED if paused else CollectorState.RUNNING

    def hold_pause(self) -> None:
        """One more pause held: a running collector is now ``PAUSED``."""
        self._pauses += 1
        if self._state is CollectorState.RUNNING:
            self.move(CollectorState.PAUSED)

    def release_pause(self) -> None:
        """One pause fewer: when none is left, a paused collector is ``RUNNING`` again."""
        assert self._pauses > 0
        self._pauses -= 1
        if self._pauses == 0 and self._state is CollectorState.PAUSED:
            self.move(CollectorState.RUNNING)

    # -- who owns its life -------------------------------------------------------------------------
    @property
    def entered(self) -> bool:
        """Whether an ``async with`` block was entered: the block's end shuts it down, not the end of its frames."""
        return _Use.ASYNC_WITH in self._uses

    def enter(self) -> None:
        """An ``async with`` block was entered."""
        self._uses |= _Use.ASYNC_WITH

    # -- background mode ------------------------------------------------------------------------
    @property
    def background(self) -> bool:
        """Whether ``start()`` was called (the collector then fills a replay buffer, never yields batches)."""
        return _Use.BACKGROUND in self._uses

    def enter_background(self) -> None:
        """``start()`` was called (once; the caller checks)."""
        assert _Use.BACKGROUND not in self._uses
        self._uses |= _Use.BACKGROUND
