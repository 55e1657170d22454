"""What one worker incarnation was told and what it acknowledged: commands counted as they go, weight acks.

A :class:`WorkerCommands` is a part of a :class:`~acollect._workers.handles.WorkerHandle`. The pool counts each
command that changes a worker at a batch boundary (``P.BOUNDARY``) or starts its envs afresh (``P.RESETS``) before it
goes, since the worker counts them on arrival and its batches say how many they began after; the receive loop files
its answers to weight pushes, which the weight pusher waits on.

Examples:
    >>> from acollect._workers import protocol as P
    >>> commands = WorkerCommands()
    >>> commands.on_send(P.SEED)
    >>> commands.changes_sent, commands.resets_sent
    (1, 1)
    >>> commands.on_ack({"version": 2, "error": "it does not fit"})
    (2, 'it does not fit')
    >>> commands.acked_version, commands.weights_refused
    (0, (2, 'it does not fit'))
"""

from __future__ import annotations

from typing import Any

from acollect._workers import protocol as P

__all__ = ["WorkerCommands"]


class WorkerCommands:
    """The commands sent to one worker incarnation that its batches count, and its answers to weight pushes."""

    __slots__ = ("_acked_version", "_changes_sent", "_resets_sent", "_weights_refused")

    def __init__(self) -> None:
        # Commands sent to this incarnation that change it at a batch boundary (P.BOUNDARY) or start its envs
        # afresh (P.RESETS): its batches count those they began after.
        self._changes_sent = 0
        self._resets_sent = 0
        self._acked_version = 0
        self._weights_refused: tuple[int, str] | None = None

    @property
    def changes_sent(self) -> int:
        """``P.BOUNDARY`` messages sent to this incarnation."""
        return self._changes_sent

    @property
    def resets_sent(self) -> int:
        """``P.RESETS`` messages sent to this incarnation (its batches count those they began after)."""
        return self._resets_sent

    @property
    def acked_version(self) -> int:
        """The last weights version this incarnation acknowledged."""
        return self._acked_version

    @property
    def weights_refused(self) -> tuple[int, str] | None:
        """``(version, why)`` of the last push it refused (it keeps its previous weights)."""
        return self._weights_refused

    def on_new_incarnation(self) -> None:
        """A new process takes the slot: it was sent nothing and acknowledged nothing yet (the last push refused is
        kept)."""
        self._acked_version = 0
        self._changes_sent = self._resets_sent = 0

    def on_send(self, kind: str) -> None:
        """A command of ``kind`` goes to it now (counted before it goes: the worker counts it on arrival)."""
        if kind in P.BOUNDARY:
            self._changes_sent += 1
        if kind in P.RESETS:
            self._resets_sent += 1

    def on_ack(self, header: dict[str, Any]) -> tuple[int, str] | None:
        """It acknowledged a push, or refused it (returns ``(version, why)`` then)."""
        if header.get("error") is not None:
            self._weights_refused = (int(header["version"]), str(header["error"])[:2000])
            return self._weights_refused
        self._acked_version = max(self._acked_version, int(header["version"]))
        return None
