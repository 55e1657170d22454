"""What one worker incarnation was told: the commands its batches count, counted as they go.

A :class:`WorkerCommands` is a part of a :class:`~acollect._workers.handles.WorkerHandle`. The pool counts each
command that changes a worker at a batch boundary (``P.BOUNDARY``) or starts its envs afresh (``P.RESETS``) before it
goes, since the worker counts them on arrival and its batches say how many they began after. (Its answers to weight
pushes are the weight pusher's: :class:`~acollect._workers.weight_push.WeightPusher`.)

Examples:
    >>> from acollect._workers import protocol as P
    >>> commands = WorkerCommands()
    >>> commands.on_send(P.SEED)
    >>> commands.changes_sent, commands.resets_sent
    (1, 1)
"""

from __future__ import annotations

from acollect._workers import protocol as P

__all__ = ["WorkerCommands"]


class WorkerCommands:
    """The commands sent to one worker incarnation that its batches count."""

    __slots__ = ("_changes_sent", "_resets_sent")

    def __init__(self) -> None:
        # Commands sent to this incarnation that change it at a batch boundary (P.BOUNDARY) or start its envs
        # afresh (P.RESETS): its batches count those they began after.
        self._changes_sent = 0
        self._resets_sent = 0

    @property
    def changes_sent(self) -> int:
        """``P.BOUNDARY`` messages sent to this incarnation."""
        return self._changes_sent

    @property
    def resets_sent(self) -> int:
        """``P.RESETS`` messages sent to this incarnation (its batches count those they began after)."""
        return self._resets_sent

    def on_new_incarnation(self) -> None:
        """A new process takes the slot: it was sent nothing yet."""
        self._changes_sent = self._resets_sent = 0

    def on_send(self, kind: str) -> None:
        """A command of ``kind`` goes to it now (counted before it goes: the worker counts it on arrival)."""
        if kind in P.BOUNDARY:
            self._changes_sent += 1
        if kind in P.RESETS:
            self._resets_sent += 1
