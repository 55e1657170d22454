"""The lifecycle every collector shares.

A collector is an async iterator of batches and an async resource. This
module owns the parts that do not depend on *where* envs run: the state
machine, ``total_frames`` accounting, background mode (``start()`` /
``pause()``) and the rule that an error in the background task is never lost.
Subclasses implement four coroutines: ``_setup`` (build what collects),
``_collect_batch`` (one batch), ``_push_weights`` and ``_teardown``.

Statistics (:meth:`CollectorBase.stats`) and the ``progress=`` display live here
too: the base counts what is handed out, and a subclass reports, per batch and
per worker, the policy version and the episodes that ended
(:meth:`CollectorBase._record_worker`).

States::

    NEW ──(async with / first batch / start())──▶ RUNNING ◀──▶ PAUSED
     │                                               │           │
     └───────────────(async_shutdown())──────▶ CLOSING ──▶ CLOSED
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import anyio
from tensordict import TensorDictBase

from acollect.errors import (
    BackgroundCollectionError,
    ClosedCollectorError,
    CollectorStateError,
    ConfigurationError,
)
from acollect.progress import ProgressReporter, check_progress, make_progress
from acollect.stats import CollectorStats, EpisodeSummary, StatsRecorder

__all__ = ["CollectorBase", "CollectorState", "SupportsExtend"]

logger = logging.getLogger("acollect")

_Collector = TypeVar("_Collector", bound="CollectorBase")

#: Seconds async_shutdown() waits for the cancelled background task before tearing down under it.
_TASK_CANCEL_TIMEOUT = 5.0


class CollectorState(enum.Enum):
    """Where a collector is in its life."""

    NEW = "new"
    RUNNING = "running"
    PAUSED = "paused"
    CLOSING = "closing"
    CLOSED = "closed"


class SupportsExtend(Protocol):
    """Anything a background collector can fill: ``acollect.ReplayBuffer``, torchrl's ``ReplayBuffer``..."""

    def extend(self, data: TensorDictBase, /) -> Any:
        """Adds a batch of transitions."""


def check_total_frames(total_frames: object, frames_per_batch: int) -> int:
    """Validates ``total_frames`` (``-1`` means endless) and warns when it is not a multiple of the batch."""
    if isinstance(total_frames, bool) or not isinstance(total_frames, int) or (
        total_frames <= 0 and total_frames != -1
    ):
        raise ConfigurationError.bad_value("total_frames", total_frames, "a positive int, or -1 for endless collection")
    if total_frames > 0 and total_frames % frames_per_batch:
        warnings.warn(
            f"total_frames={total_frames} is not a multiple of frames_per_batch={frames_per_batch}: the last "
            f"batch ends past it, at {math.ceil(total_frames / frames_per_batch) * frames_per_batch} frames.",
            UserWarning,
            stacklevel=3,
        )
    return total_frames


class CollectorBase:
    """Shared lifecycle of all collectors (TorchRL calls it ``DataCollectorBase``).

    Subclasses call ``super().__init__(frames_per_batch=..., total_frames=..., progress=...)`` and implement
    ``_setup``, ``_collect_batch``, ``_push_weights`` and ``_teardown``.
    """

    def __init__(self, *, frames_per_batch: int, total_frames: int, progress: bool | str = False) -> None:
        self.frames_per_batch = frames_per_batch
        self.total_frames = check_total_frames(total_frames, frames_per_batch)
        self._progress_kind = check_progress(progress)
        self._progress: ProgressReporter | None = None
        self._stats = StatsRecorder()
        self._state = CollectorState.NEW
        self._frames = 0
        self._batches = 0
        self._setup_done = False
        self._setup_lock: asyncio.Lock | None = None
        self._bg_task: asyncio.Task[None] | None = None
        self._bg_error: BaseException | None = None
        self._bg_error_reported = False
        self._replay_buffer: SupportsExtend | None = None
        self._pauses = 0
        self._resume = asyncio.Event()
        self._resume.set()
        self._bg_idle = asyncio.Event()
        self._bg_idle.set()

    # -- subclass hooks ----------------------------------------------------------------
    async def _setup(self) -> None:
        """Builds envs, policies, workers. Runs once, before the first batch."""

    async def _collect_batch(self) -> TensorDictBase:
        """Collects and returns one batch."""
        raise NotImplementedError

    async def _teardown(self) -> None:
        """Releases everything ``_setup`` built. Must be safe after a partial or failed setup."""

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> CollectorState:
        """The current :class:`CollectorState`."""
        return self._state

    @property
    def frames(self) -> int:
        """Frames handed out so far (a resumed collector continues the count)."""
        return self._frames

    def __len__(self) -> int:
        """Number of batches the collector yields in all; endless collectors have no length."""
        if self.total_frames == -1:
            raise TypeError("an endless collector (total_frames=-1) has no len()")
        return math.ceil(self.total_frames / self.frames_per_batch)

    @property
    def exhausted(self) -> bool:
        """Whether ``total_frames`` were collected."""
        return self.total_frames != -1 and self._frames >= self.total_frames

    def _check_usable(self, action: str) -> None:
        self._raise_background_error()
        if self._state in (CollectorState.CLOSING, CollectorState.CLOSED):
            raise ClosedCollectorError(f"cannot {action}: the collector was shut down with async_shutdown()")

    def _raise_background_error(self) -> None:
        if self._bg_error is not None and not self._bg_error_reported:
            self._bg_error_reported = True
            err = self._bg_error
            raise BackgroundCollectionError(
                f"background collection failed: {type(err).__name__}: {err}"
            ) from err

    async def _ensure_setup(self) -> None:
        if self._setup_done:
            return
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self._setup_done:
                return
            if self._state is CollectorState.NEW:
                self._state = CollectorState.RUNNING
            await self._setup()
            self._setup_done = True
            self._stats.start()  # frame rates count from here: building envs and workers is not collecting

    # -- async resource ------------------------------------------------------------------
    async def __aenter__(self: _Collector) -> _Collector:
        self._check_usable("enter the collector")
        try:
            await self._ensure_setup()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.async_shutdown(raise_background_error=False)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.async_shutdown(raise_background_error=exc_info[0] is None)

    async def async_shutdown(self, *, raise_background_error: bool = True) -> None:
        """Stops collection and releases every resource; calling it twice is fine.

        Safe from any state. A failure of the background task that was not reported yet is raised
        here (as :class:`~acollect.errors.BackgroundCollectionError`) after everything is released.
        """
        if self._state is CollectorState.CLOSED:
            return
        self._state = CollectorState.CLOSING
        try:
            with anyio.CancelScope(shield=True):
                task, self._bg_task = self._bg_task, None
                if task is not None and not task.done():
                    task.cancel()
                    # A deadline even here: a task that swallowed its cancellation must not hang shutdown.
                    # Teardown below closes what it waits on, which ends it for good.
                    await asyncio.wait({task}, timeout=_TASK_CANCEL_TIMEOUT)
                    if not task.done():
                        logger.error("the background task ignored its cancellation; tearing down under it")
                self._resume.set()
                await self._teardown()
        finally:
            self._state = CollectorState.CLOSED
            self._close_progress()
        if raise_background_error:
            self._raise_background_error()

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self: _Collector) -> _Collector:
        return self

    async def __anext__(self) -> TensorDictBase:
        self._check_usable("iterate")
        if self._bg_task is not None:
            raise CollectorStateError(
                "cannot iterate a collector that runs in the background (start() was called): "
                "read from its replay buffer instead"
            )
        if self._state is CollectorState.PAUSED:
            raise CollectorStateError("cannot iterate a paused collector: leave the pause() block first")
        if self.exhausted:
            raise StopAsyncIteration
        await self._ensure_setup()
        batch = await self._collect_batch()
        self._count(batch)
        return batch

    def _count(self, batch: TensorDictBase) -> None:
        frames = batch.numel()
        self._frames += frames
        self._batches += 1
        self._stats.record_batch(frames)
        if self._progress_kind is not None:
            if self._progress is None:
                self._progress = make_progress(self._progress_kind, total_frames=self.total_frames,
                                               name=type(self).__name__)  # fmt: skip
            if self._progress is not None:
                self._progress.update(self.stats())

    def _close_progress(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            try:
                progress.close(self.stats())
            except Exception as exc:  # a broken display must not hide how the shutdown went
                logger.warning("closing the progress display failed: %s: %s", type(exc).__name__, exc)

    # -- statistics ----------------------------------------------------------------------
    def stats(self) -> CollectorStats:
        """Progress so far: frames, frames/s, episodes and their returns, policy lag, restarts.

        Cheap to call (no message to any worker): collectors fill it from what comes with each batch.
        Episode returns and lengths are counted over whole episodes, across batch boundaries.

        Examples:
            >>> import anyio
            >>> from acollect import Collector
            >>> from acollect.testing import CountingEnv
            >>> async def main():
            ...     env = lambda: CountingEnv(num_envs=2, episode_length=5)  # reward 1 per step
            ...     async with Collector(env, frames_per_batch=20, total_frames=40) as collector:
            ...         async for _ in collector:
            ...             pass
            ...         return collector.stats()
            >>> stats = anyio.run(main)
            >>> stats.frames, stats.episodes, stats.episode_return_mean, stats.policy_lag
            (40, 8, 5.0, {0: 0})
        """
        restarts, dropped = self._worker_counters()
        return self._stats.snapshot(
            frames=self._frames,
            batches=self._batches,
            policy_version=int(getattr(self, "policy_version", 0)),
            restarts=restarts,
            dropped_batches=dropped,
        )

    def _record_worker(
        self, worker: int, frames: int, policy_version: int, episodes: EpisodeSummary | None = None
    ) -> None:
        """Hook for subclasses, on the event loop: a worker (``0`` in-process) produced a batch."""
        self._stats.record_worker(worker, frames, policy_version, episodes)

    def _worker_counters(self) -> tuple[int, int]:
        """Hook for collectors with worker processes: ``(restarts, dropped batches)`` so far."""
        return 0, 0

    # -- background mode -------------------------------------------------------------------
    def start(self, replay_buffer: SupportsExtend | None = None) -> None:
        """Starts collecting in the background, extending ``replay_buffer`` batch after batch.

        Call it from a running event loop. The task belongs to the collector: it stops at
        :meth:`async_shutdown`, and its failure is raised at the next call on the collector.

        Args:
            replay_buffer: any object with an ``extend(batch)`` method (an :class:`acollect.ReplayBuffer`, a
                torchrl ``ReplayBuffer``...).

        Raises:
            CollectorStateError: the collector was already started, or no event loop runs.
            ConfigurationError: ``replay_buffer`` has no ``extend`` method.
        """
        self._check_usable("start()")
        if self._bg_task is not None:
            raise CollectorStateError("start() was already called on this collector")
        if replay_buffer is None or not callable(getattr(replay_buffer, "extend", None)):
            raise ConfigurationError.bad_value(
                "replay_buffer", replay_buffer, "an object with an extend(batch) method (e.g. acollect.ReplayBuffer)"
            )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError as exc:
            raise CollectorStateError("start() must be called from a running event loop") from exc
        self._replay_buffer = replay_buffer
        self._bg_task = loop.create_task(self._run_background(replay_buffer), name="acollect-background")

    @property
    def running_in_background(self) -> bool:
        """Whether a background task started by :meth:`start` is alive."""
        return self._bg_task is not None and not self._bg_task.done()

    async def _run_background(self, replay_buffer: SupportsExtend) -> None:
        try:
            await self._ensure_setup()
            while not self.exhausted:
                await self._resume.wait()
                self._bg_idle.clear()
                try:
                    batch = await self._collect_batch()
                    replay_buffer.extend(batch)
                    self._count(batch)
                finally:
                    self._bg_idle.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # kept and raised at the next call, never lost
            logger.error("background collection failed: %s: %s", type(exc).__name__, exc)
            self._bg_error = exc

    @asynccontextmanager
    async def pause(self) -> AsyncIterator[None]:
        """Stops collection until the block exits.

        In background mode, entering waits for the batch in flight to be handed to the replay buffer;
        inside the block no frame is collected (the buffer stops growing). Blocks may nest.

        Examples:
            >>> async def evaluate(collector):  # doctest: +SKIP
            ...     async with collector.pause():
            ...         ...  # the buffer does not grow here
        """
        self._check_usable("pause()")
        self._pauses += 1
        self._resume.clear()
        if self._state is CollectorState.RUNNING:
            self._state = CollectorState.PAUSED
        try:
            await self._bg_idle.wait()
            yield
        finally:
            self._pauses -= 1
            if self._pauses == 0:
                if self._state is CollectorState.PAUSED:
                    self._state = CollectorState.RUNNING
                self._resume.set()

    # -- repr --------------------------------------------------------------------------
    def __repr__(self) -> str:
        total = "endless" if self.total_frames == -1 else self.total_frames
        return (
            f"{type(self).__name__}(state={self._state.name}, frames={self._frames}/{total}, "
            f"frames_per_batch={self.frames_per_batch})"
        )
