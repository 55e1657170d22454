"""Live progress of a collector: a tqdm bar, or a periodic log line.

A collector built with ``progress=True`` shows its frames, frames/s and mean
episode return as it collects: as a tqdm bar when tqdm is installed (the
``acollect[progress]`` extra), else as a line logged every few seconds on the
``acollect.progress`` logger. Nothing is shown unless asked for.

The log line is at INFO level. Asking for progress sets that logger to INFO (if
its level was never set), and when no handler is configured anywhere it adds
one writing to stderr, so the lines appear without any logging set-up; with
``logging.basicConfig`` or your own handlers they go wherever your logs go.

Examples:
    >>> check_progress(False) is None
    True
    >>> check_progress("log")
    'log'
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
from typing import Any, Protocol

from acollect.errors import ConfigurationError
from acollect.stats import CollectorStats

__all__ = ["LOG_INTERVAL_S", "LogProgress", "ProgressReporter", "TqdmProgress", "check_progress", "make_progress"]

_logger = logging.getLogger("acollect.progress")

#: Seconds between two log lines of :class:`LogProgress`.
LOG_INTERVAL_S = 10.0


class ProgressReporter(Protocol):
    """Shows a collector's progress; told about every batch and about the end."""

    def update(self, stats: CollectorStats) -> None:
        """A batch was handed out; ``stats`` is the collector's state after it."""

    def close(self, stats: CollectorStats) -> None:
        """Collection ended (the collector is shutting down)."""


def _tqdm_installed() -> bool:
    return importlib.util.find_spec("tqdm") is not None


def check_progress(progress: object) -> str | None:
    """Validates a ``progress=`` argument: ``None`` (off), ``"tqdm"`` or ``"log"``.

    ``True`` picks tqdm when it is installed, else the log line.

    Raises:
        ConfigurationError: an unknown value, or ``"tqdm"`` without tqdm installed.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        return "tqdm" if _tqdm_installed() else "log"
    if progress == "log":
        return "log"
    if progress == "tqdm":
        if not _tqdm_installed():
            raise ConfigurationError.bad_value(
                "progress", progress, "True, False or 'log' (tqdm is not installed: pip install 'acollect[progress]')"
            )
        return "tqdm"
    raise ConfigurationError.bad_value("progress", progress, "True, False, 'tqdm' or 'log'")


def make_progress(kind: str | None, *, total_frames: int, name: str) -> ProgressReporter | None:
    """A reporter of the kind :func:`check_progress` returned, or ``None``."""
    if kind is None:
        return None
    if kind == "tqdm":
        return TqdmProgress(total_frames=total_frames, name=name)
    return LogProgress(total_frames=total_frames, name=name)


def _return_text(stats: CollectorStats) -> str:
    return "-" if stats.episode_return_mean is None else f"{stats.episode_return_mean:.4g}"


class TqdmProgress:
    """A tqdm bar counting frames; tqdm shows the frame rate, the postfix the mean episode return."""

    def __init__(self, *, total_frames: int, name: str) -> None:
        from tqdm.auto import tqdm

        self._bar: Any = tqdm(
            total=total_frames if total_frames > 0 else None,
            desc=name,
            unit=" frames",
            dynamic_ncols=True,
            file=sys.stderr,
        )
        self._shown = 0
        self._paused = False

    def update(self, stats: CollectorStats) -> None:
        if stats.paused:
            bound = ", paused"
        else:
            bound = f", bound by {stats.bottleneck}" if stats.bottleneck is not None else ""
        self._bar.set_postfix_str(f"return {_return_text(stats)}, {stats.episodes} episodes{bound}", refresh=False)
        self._bar.update(max(0, stats.frames - self._shown))
        self._shown = stats.frames
        if stats.paused != self._paused:  # no batch comes while paused: shown now, not at the next one
            self._paused = stats.paused
            self._bar.refresh()

    def close(self, stats: CollectorStats) -> None:
        self.update(stats)
        self._bar.close()


class LogProgress:
    """One INFO line on the ``acollect.progress`` logger at the first batch, then every ``interval_s`` seconds, and
    at once when a pause begins or ends."""

    def __init__(self, *, total_frames: int, name: str, interval_s: float = LOG_INTERVAL_S) -> None:
        self.name = name
        self.total_frames = total_frames
        self.interval_s = interval_s
        self._next_at = 0.0
        self._logged_frames = -1
        self._paused = False
        if _logger.level == logging.NOTSET:
            _logger.setLevel(logging.INFO)
        if not _logger.hasHandlers():
            # No logging set up at all: without a handler, INFO lines would go nowhere.
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
            _logger.addHandler(handler)

    def _line(self, stats: CollectorStats) -> str:
        return f"{self.name}: {stats.describe(self.total_frames)}"

    def update(self, stats: CollectorStats) -> None:
        now = time.monotonic()
        if now < self._next_at and stats.paused == self._paused:
            return
        self._paused = stats.paused
        self._next_at = now + self.interval_s
        self._logged_frames = stats.frames
        _logger.info("%s", self._line(stats))

    def close(self, stats: CollectorStats) -> None:
        if stats.frames != self._logged_frames and stats.batches:
            _logger.info("%s", self._line(stats))
