"""What a collector counts as it goes: frames and batches, the statistics behind ``stats()``, the progress display.

:class:`Counts` is one of a collector's parts, with one writer: the collector's lifecycle counts what it hands out
(:meth:`Counts.count_frames`, :meth:`Counts.count_batch`), each collector reports, per batch and per worker, the
policy version, the episodes that ended and where the worker's time went (to its recorder, :attr:`Counts.stats`),
and ``load_state_dict`` restores the counts (:meth:`Counts.restore`). Nobody else writes its own fields.

Examples:
    >>> counts = Counts(total_frames=64, progress=False)
    >>> counts.count_frames(32); counts.count_batch()
    >>> counts.frames, counts.batches
    (32, 1)
    >>> counts.snapshot(policy_version=0, counters={}).frames
    32
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from acollect._progress import ProgressReporter, check_progress, make_progress
from acollect.stats import CollectorStats, StatsRecorder

__all__ = ["Counts"]

logger = logging.getLogger("acollect")


class Counts:
    """Frames and batches counted, the statistics of :class:`~acollect.CollectorStats`, and the progress display.

    Args:
        total_frames: the collector's ``total_frames`` (for the progress display; ``-1``: endless).
        progress: the collector's ``progress`` option (checked here).
        name: what the progress display calls the collector.
    """

    __slots__ = ("_batches", "_frames", "_name", "_progress", "_progress_kind", "stats", "total_frames")

    def __init__(self, *, total_frames: int, progress: bool | str, name: str = "collector") -> None:
        self.total_frames = total_frames
        self._progress_kind = check_progress(progress)
        self._progress: ProgressReporter | None = None
        self._name = name
        #: what ``stats()`` is made of: the collector starts it once collection starts, reports each worker's
        #: batch to it (``record_worker``) and makes it forget a worker lost for good (``time.forget``)
        self.stats = StatsRecorder()
        self._frames = 0
        self._batches = 0

    @property
    def frames(self) -> int:
        """Frames collected so far (toward ``total_frames``; a resumed collector continues the count)."""
        return self._frames

    @property
    def batches(self) -> int:
        """Batches handed out so far."""
        return self._batches

    def count_batch(self) -> None:
        """Counts a batch handed out (its frames are counted as they are collected, :meth:`count_frames`)."""
        self._batches += 1

    def count_frames(self, frames: int) -> None:
        """Counts ``frames`` collected (toward ``total_frames``, and in the frame rates)."""
        self._frames += frames
        self.stats.record_batch(frames)

    def show(self, stats: CollectorStats) -> None:
        """Updates the progress display with ``stats`` (made at the first call; nothing without a display)."""
        if self._progress_kind is None:
            return
        if self._progress is None:
            self._progress = make_progress(self._progress_kind, total_frames=self.total_frames, name=self._name)
        if self._progress is not None:
            self._progress.update(stats)

    @property
    def shows_progress(self) -> bool:
        """Whether a progress display was asked for (the collector then passes its stats with each count)."""
        return self._progress_kind is not None

    def set_paused(self, paused: bool) -> None:
        """A pause was applied (``True``) or lifted (``False``): the statistics say so, and leave its time out."""
        if paused:
            self.stats.pause()
        else:
            self.stats.resume()

    def restore(self, frames: int, batches: int) -> None:
        """The counts of a saved state (``load_state_dict``)."""
        self._frames, self._batches = frames, batches

    def snapshot(self, *, policy_version: int, counters: Mapping[str, int]) -> CollectorStats:
        """The collector's :class:`~acollect.CollectorStats` now; ``counters``: its counts by field name."""
        return self.stats.snapshot(
            frames=self._frames, batches=self._batches, policy_version=policy_version, counters=counters
        )

    def close_progress(self, stats: CollectorStats) -> None:
        """Ends the progress display (with the last figures), if one was shown; never raises."""
        progress, self._progress = self._progress, None
        if progress is not None:
            try:
                progress.close(stats)
            except Exception as exc:  # a broken display must not hide how the shutdown went
                logger.warning("closing the progress display failed: %s: %s", type(exc).__name__, exc)
