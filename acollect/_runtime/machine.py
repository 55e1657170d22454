"""State tables: an object's states, the moves it allows and why each happens, checked in one place.

Every stateful object in acollect (a collector's lifecycle, a worker as the pool sees it, the worker pool, a
worker process's loop) keeps its state in one enum and changes it only through its table's :meth:`StateTable.move`,
which raises :class:`IllegalTransition` (a bug in acollect, never a user error) on a move the table does not list.
The moves are declared once, each with the reason it happens; the allowed moves are derived from them, and
:meth:`StateTable.markdown` renders the table that ``docs/concepts.md`` shows (a test keeps the two the same).

Examples:
    >>> import enum
    >>> class Door(enum.Enum):
    ...     OPEN = "open"
    ...     SHUT = "shut"
    >>> DOOR = StateTable("door", {Door.OPEN: "you can pass", Door.SHUT: "you cannot"},
    ...                   {(Door.OPEN, Door.SHUT): "someone shut it", (Door.SHUT, Door.OPEN): "someone opened it"})
    >>> DOOR.move(Door.OPEN, Door.SHUT)
    <Door.SHUT: 'shut'>
    >>> DOOR.move(Door.SHUT, Door.SHUT)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    acollect._runtime.machine.IllegalTransition: internal error: the door cannot move from SHUT to SHUT ...
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

__all__ = ["IllegalTransition", "StateTable"]

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(RuntimeError):
    """A state change the table does not allow: a bug in acollect, not in the caller's code."""


class StateTable(Generic[S]):
    """The states of one kind of object, what each means, and every allowed move with the reason it happens.

    Args:
        name: what the states are of (named by the error of an illegal move, e.g. ``"worker"``).
        meanings: one line per state (every state of the enum).
        reasons: every allowed move ``(from, to)`` and why it happens; a move not listed is illegal.

    Raises:
        ValueError: a state of the enum has no meaning.
    """

    def __init__(self, name: str, meanings: Mapping[S, str], reasons: Mapping[tuple[S, S], str]) -> None:
        states = list(type(next(iter(meanings))))
        missing = [s.name for s in states if s not in meanings]
        if missing:
            raise ValueError(f"the {name} table gives no meaning to {missing}")
        self.name = name
        self.states: list[S] = states
        self.meanings = dict(meanings)
        self.reasons = dict(reasons)
        #: state -> the states it may move to (derived from ``reasons``)
        self.transitions: dict[S, frozenset[S]] = {
            state: frozenset(to for (frm, to) in reasons if frm is state) for state in states
        }

    def move(self, now: S, to: S) -> S:
        """Returns ``to`` if the table allows moving there from ``now``; raises :class:`IllegalTransition` if not."""
        allowed = self.transitions[now]
        if to not in allowed:
            names = ", ".join(sorted(s.name for s in allowed)) or "none"
            raise IllegalTransition(
                f"internal error: the {self.name} cannot move from {now.name} to {to.name} (allowed: {names}); "
                "this is a bug in acollect"
            )
        return to

    def markdown(self) -> str:
        """The table as Markdown: each state, what it means, and where it moves to and when."""
        lines = ["| state | what it means | moves to: when |", "|---|---|---|"]
        for state in self.states:
            moves = "<br>".join(
                f"`{to.name}`: {self.reasons[state, to]}" for to in self.states if to in self.transitions[state]
            )
            lines.append(f"| `{state.name}` | {self.meanings[state]} | {moves or 'none: final'} |")
        return "\n".join(lines) + "\n"
