"""The lifecycle every collector shares, and the rules for calling a collector from several tasks.

A collector is an async iterator of batches and an async resource. This module
owns what does not depend on *where* envs run: the state machine, the one task
group that owns the collector's background tasks (:class:`~acollect._runtime.tasks.TaskOwner`),
``total_frames`` accounting, background mode (``start()`` / ``pause()``) and the
rule that a failure is never lost. Subclasses implement ``_setup`` (build what
collects), ``_collect_batch`` (one batch), ``_teardown`` and, where workers must
be told, ``_apply_pause``.

States (one machine, :class:`~acollect._runtime.lifecycle.Lifecycle`: every move goes through its
``move()`` and its table, ``TRANSITIONS``; ``docs/concepts.md`` shows that table)::

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

Calling from several tasks (every collector follows these rules; ``docs/concepts.md``):

* ``async_shutdown()`` may be called from any task, any number of times, at once: every call returns
  only when everything is released, and every task waiting on the collector wakes promptly with
  :class:`~acollect.errors.ClosedCollectorError`.
* Two consumers are served one after the other (a lock, fair in arrival order), never interleaved
  inside one batch.
* ``pause()`` nests and overlaps across tasks: workers stop while any pause is held.
* A failure (a worker died, the background task raised) moves the collector to BROKEN at once;
  waiting calls wake with it and later calls raise it, until ``async_shutdown()``.
* A cancelled call leaves nothing behind; a cancelled set-up is torn down and the collector is NEW
  again (usable), so a retry starts afresh.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, ClassVar, NoReturn, TypeVar

import anyio
import torch
from tensordict import TensorDictBase
from typing_extensions import Never

from acollect._batches.plan import BatchPlan
from acollect._batches.tally import Tally
from acollect._batches.trajectory_batches import TrajectoryAssembler
from acollect._runtime.lifecycle import CloseReason, CollectorState, Lifecycle
from acollect._runtime.loops import current_backend
from acollect._runtime.notify import Notifier
from acollect._runtime.tasks import CallScope, TaskOwner
from acollect._validate import check_int, check_seconds, check_total_frames
from acollect._warnings import warn_unclosed
from acollect._weights.updates import WeightUpdate
from acollect.collectors._background import BackgroundRun, ReplayRatio, Started
from acollect.errors import (
    BackgroundCollectionError,
    ClosedCollectorError,
    CollectorStateError,
    ConfigurationError,
)
from acollect.replay_buffer import SupportsExtend, extend_from_loop
from acollect.stats import CollectorStats

if TYPE_CHECKING:
    from acollect._weights.updates import Weights
    from acollect.collectors._options import RolloutSettings

__all__ = ["CollectorBase", "CollectorState", "SupportsExtend"]

logger = logging.getLogger("acollect")

_Collector = TypeVar("_Collector", bound="CollectorBase")
_T = TypeVar("_T")

#: Batches of more bytes are cut into episodes in a thread: a CartPole batch of 2,048 frames (140 KiB, a hundred
#: episode pieces) takes 2-4 ms, which the event loop's other tasks (heartbeats, a sampler) would wait for.
_INLINE_ASSEMBLY_BYTES = 1 << 16

#: Seconds async_shutdown() waits for cancelled calls and tasks to leave before tearing down under them.
#: A collection thread notices its stop event within one env step, so this is only reached by a hung env.
_DRAIN_TIMEOUT = 10.0


class CollectorBase:
    """Shared lifecycle of all collectors (TorchRL calls it ``DataCollectorBase``).

    Subclasses name the class of their options (``settings_class``), call ``super().__init__(batch=...,
    total_frames=..., progress=...)`` with their :class:`~acollect._batches.plan.BatchPlan` and implement
    ``_setup``, ``_collect_batch`` and ``_teardown``.
    """

    #: The class of this collector's checked options (``collector.settings``), which declares each keyword of its
    #: signature: its type, check and doc (the options reference is rendered from it).
    settings_class: ClassVar[type[RolloutSettings]]
    #: The options given, checked, every default filled in.
    settings: RolloutSettings

    def __init__(self, *, batch: BatchPlan, total_frames: int, progress: bool | str = False) -> None:
        """``batch``: what each batch holds, settled as far as the arguments tell (see :meth:`_settle_batch`)."""
        self._batch = batch
        self.total_frames = check_total_frames(total_frames, batch.frames_per_batch)
        # Frames, batches, statistics and the progress display: one part, counted only through its methods.
        self._tally = Tally(total_frames=self.total_frames, progress=progress, name=type(self).__name__)
        self._lifecycle = Lifecycle()  # the state, and all it depends on: read it, never keep a copy
        self._tasks = TaskOwner(type(self).__name__, on_failure=self._fail, on_loop_end=self._on_loop_end)
        self._calls: set[CallScope] = set()
        self._changes = Notifier()  # calls leaving, pauses ending, the background batch handed over
        self._setup_lock = anyio.Lock()
        self._consumer_lock = anyio.Lock()
        self._pause_lock = anyio.Lock()
        self._run = BackgroundRun()
        self._shutdown_limit = 30.0
        # trajs_per_batch: whole episodes gathered from the batches collected (made at the first batch).
        self._assembler: TrajectoryAssembler | None = None

    # -- subclass hooks ----------------------------------------------------------------
    async def _setup(self) -> None:
        """Builds envs, policies, workers. Runs once, before the first batch; may spawn into ``self._tasks``."""

    async def _collect_batch(self) -> TensorDictBase:
        """Collects and returns one batch."""
        raise NotImplementedError

    async def _teardown(self) -> None:
        """Releases everything ``_setup`` built. Must be safe after a partial, cancelled or failed setup."""

    async def _apply_pause(self, paused: bool) -> None:
        """Tells whatever collects to stop (``True``) or go on (``False``); called with the pause lock held."""

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        """Puts the weights of a checked :meth:`update_policy_weights_` call in place; returns the new version."""
        raise NotImplementedError

    def _trajectory_id_stride(self) -> int:
        """The step between one worker's trajectory ids: the number of workers (worker ``k`` takes ``k, k + n...``)."""
        return 1

    def _release_now(self) -> None:
        """Releases everything ``_setup`` built without waiting: nothing can be awaited (the event loop ended, or
        the collector is being garbage collected). Workers are killed, sockets closed with ``linger=0``, shared
        memory unlinked. Must not block, nor raise."""

    # -- frames per batch: what was asked, what each batch holds -------------------------
    @property
    def requested_frames_per_batch(self) -> int:
        """The ``frames_per_batch`` given; :attr:`frames_per_batch` is what each batch holds."""
        return self._batch.requested

    @property
    def frames_per_batch(self) -> int:
        """The frames each batch holds: :attr:`requested_frames_per_batch` rounded up so that every env steps
        equally often (with a warning when it differs). Known at construction where the arguments say how many
        envs there are (a gymnasium id and its ``num_envs``), else once the envs are built, at set-up."""
        return self._batch.frames_per_batch

    def _settle_batch(self, n_envs: Sequence[int | None]) -> None:
        """Settles what each batch holds from each worker's number of envs, once the built envs told (where the
        arguments did not); on the event loop, so that a warning points at the user's ``async with`` line.

        ``total_frames`` is checked against it again (a warning where it is no multiple of it any more).
        """
        if self._batch.settle(n_envs):
            check_total_frames(self.total_frames, self._batch.frames_per_batch)

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> CollectorState:
        """The current :class:`CollectorState`."""
        return self._lifecycle.state

    @property
    def frames(self) -> int:
        """Frames collected so far (a resumed collector continues the count); all handed out, but with
        ``trajs_per_batch``, where those of the episodes in progress are held until the episodes end."""
        return self._tally.frames

    def stats(self) -> CollectorStats:
        """Progress so far: frames, frames/s, episodes and their returns, policy lag, restarts, where the time goes.

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
        return self._tally.snapshot(policy_version=int(getattr(self, "policy_version", 0)), counters=self._counters())

    def _counters(self) -> dict[str, int]:
        """Hook: what a collector counted so far, by :class:`~acollect.CollectorStats` field (``restarts``,
        ``dropped_batches``, ``discarded_frames``, ``stale_batches``...); those left out are 0."""
        return {}

    def _count_frames(self, frames: int) -> None:
        """Counts ``frames`` collected (toward ``total_frames``), and shows them where progress is displayed."""
        self._tally.count_frames(frames)
        if self._tally.shows_progress:
            self._tally.show(self.stats())

    def __len__(self) -> int:
        """Number of batches the collector yields in all; endless collectors, and those handing out whole episodes
        (``trajs_per_batch``), have no length."""
        if self.total_frames == -1:
            raise TypeError("an endless collector (total_frames=-1) has no len()")
        if self.settings.trajs_per_batch is not None:
            raise TypeError(
                "a collector with trajs_per_batch has no len(): how many batches of whole episodes its total_frames "
                "make depends on how long the episodes are"
            )
        return math.ceil(self.total_frames / self.frames_per_batch)

    @property
    def exhausted(self) -> bool:
        """Whether ``total_frames`` were collected and handed out (with ``trajs_per_batch``, the episodes in
        progress then too)."""
        return self._collected_all() and (self._assembler is None or self._assembler.empty)

    def _collected_all(self) -> bool:
        return self.total_frames != -1 and self._tally.frames >= self.total_frames

    def _check_usable(self, action: str, *, allow_broken: bool = False) -> None:
        lifecycle = self._lifecycle
        if lifecycle.closing:
            reason = lifecycle.close_reason or CloseReason.SHUTDOWN
            hint = " inside the event loop that uses it" if reason is CloseReason.LOOP_ENDED else ""
            raise ClosedCollectorError(
                f"cannot {action}: this {type(self).__name__} is closed ({reason.value}); a closed collector "
                f"cannot be used again: build a new one{hint}"
            )
        self._check_loop(action)
        if lifecycle.state is CollectorState.BROKEN and not allow_broken:
            self._raise_failure()

    def _check_loop(self, action: str) -> None:
        """Raises unless the collector is used from the event loop it started on (or from synchronous code)."""
        owner = self._tasks.loop
        if owner is None or owner.is_current() or current_backend() is None:
            return
        raise CollectorStateError(
            f"cannot {action}: this {type(self).__name__} belongs to the event loop it started on ({owner!r}), "
            "not to the one running now. Its sockets, tasks and locks live on that loop: use a collector inside "
            "the asyncio.run() (or trio.run()) that started it, and build a new one for another loop "
            "(`await collector.async_shutdown()` from here releases this one)"
        )

    def _raise_failure(self) -> None:
        err = self._lifecycle.report_failure()
        raised = err
        if self._lifecycle.background:
            raised = BackgroundCollectionError(f"background collection failed: {type(err).__name__}: {err}")
            raised.__cause__ = err  # as `raise ... from err`
        context, suppress = raised.__context__, raised.__suppress_context__
        try:
            raise raised
        finally:
            # Callers raise the failure where the failure's own cancellation of their call is being handled
            # (the exit of the call's cancel scope), so the raise chained it to that internal CancelledError:
            # the user would read "Cancelled via cancel scope ... During handling ..." before the real error.
            # The failure keeps the chain it came with, and only that.
            raised.__context__, raised.__suppress_context__ = context, suppress

    def _fail(self, exc: BaseException) -> None:
        """A background task or a worker failed: BROKEN now, and every waiting call wakes with it."""
        if self._lifecycle.closing or self._lifecycle.failure is not None:
            logger.debug("after the first failure or during shutdown: %s: %s", type(exc).__name__, exc)
            return
        logger.debug("collector broken by %s: %s", type(exc).__name__, exc)
        self._lifecycle.move(CollectorState.BROKEN, failure=exc)
        for call in list(self._calls):
            if call.interrupt_on_failure:
                call.scope.cancel()
        self._changes.notify()

    @contextmanager
    def _call(self, action: str, *, interrupt_on_failure: bool = True) -> Iterator[None]:
        """Runs a public call so that ``async_shutdown()`` (and a failure) wakes it wherever it waits."""
        self._check_usable(action, allow_broken=not interrupt_on_failure)
        call = CallScope(interrupt_on_failure)
        self._calls.add(call)
        try:
            with call.scope:
                yield
        finally:
            self._calls.discard(call)
            self._changes.notify()
        if call.scope.cancelled_caught:  # our own scope: only shutdown or a failure cancels it
            if self._lifecycle.state is CollectorState.BROKEN and interrupt_on_failure:
                self._raise_failure()
            raise ClosedCollectorError(f"cannot {action}: async_shutdown() was called while it waited")

    async def _ensure_setup(self) -> None:
        if self._lifecycle.set_up:
            return
        async with self._setup_lock:
            if self._lifecycle.set_up:
                return
            self._check_usable("start collecting")
            self._tasks.ensure_group()
            await self._tasks.started()
            self._lifecycle.move(CollectorState.STARTING)
            try:
                await self._setup()
            except BaseException:
                # Cancelled or failed half-way: release what was built (shielded, so a cancellation cannot
                # cut the clean-up short) and be NEW again, so nothing leaks and a retry starts afresh.
                with anyio.CancelScope(shield=True):
                    await self._teardown()
                self._lifecycle.setup_undone()
                raise
            self._lifecycle.setup_finished()
            self._tally.start()  # frame rates count from here: building envs and workers is not collecting
        if self._lifecycle.pauses:
            await self._sync_pause()

    # -- async resource ------------------------------------------------------------------
    async def __aenter__(self: _Collector) -> _Collector:
        self._lifecycle.enter()
        try:
            with self._call("enter the collector"):  # a shutdown from another task ends the set-up too
                await self._ensure_setup()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.async_shutdown(raise_background_error=False)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._shutdown(CloseReason.ASYNC_WITH, raise_background_error=exc_info[0] is None)

    async def async_shutdown(self, timeout: float | None = None, *, raise_background_error: bool = True) -> None:
        """Stops collection and releases every resource; any task may call it, any number of times, at once.

        Every call returns only once everything is released (threads, processes, sockets, shared memory).
        Tasks waiting on the collector (a batch, a pause, a weight push) wake with
        :class:`~acollect.errors.ClosedCollectorError`. Safe from any state; shielded from cancellation.

        Args:
            timeout: the whole shutdown's deadline in seconds (default: the collector's own,
                ``shutdown_timeout`` for worker collectors).
            raise_background_error: raise a background failure (``start()``) not reported yet, as
                :class:`~acollect.errors.BackgroundCollectionError`, after everything is released.
        """
        if timeout is not None:
            self._shutdown_limit = check_seconds("timeout", timeout)
        await self._shutdown(CloseReason.SHUTDOWN, raise_background_error=raise_background_error)

    async def _shutdown(self, reason: CloseReason, *, raise_background_error: bool) -> None:
        lifecycle = self._lifecycle
        owner = self._tasks.loop
        if owner is not None and not owner.is_current() and lifecycle.state is not CollectorState.CLOSED:
            await self._shutdown_elsewhere(reason)
        elif lifecycle.state is CollectorState.CLOSING:
            # Another task is closing: return when it is done (its every step has a deadline).
            with anyio.move_on_after(self._shutdown_limit + 2 * _DRAIN_TIMEOUT):
                await lifecycle.wait_closed()
        elif lifecycle.state is not CollectorState.CLOSED:
            lifecycle.move(CollectorState.CLOSING, reason=reason)
            try:
                with anyio.CancelScope(shield=True):
                    await self._close()
            finally:
                lifecycle.move(CollectorState.CLOSED)
                self._tally.close_progress(self.stats())
        if (
            raise_background_error
            and lifecycle.background
            and lifecycle.failure is not None
            and (not lifecycle.failure_reported)
        ):
            self._raise_failure()

    async def _shutdown_elsewhere(self, reason: CloseReason) -> None:
        """A shutdown from another event loop than the collector's: its own loop does it, or, gone, nobody waits."""
        owner = self._tasks.loop
        assert owner is not None
        if owner.ended or owner.backend != "asyncio":
            self._abandon(reason, warn=False)  # a trio run in another thread cannot be handed work from here
            return
        wait = owner.submit(lambda: self._shutdown(reason, raise_background_error=False))
        await anyio.to_thread.run_sync(wait, self._shutdown_limit + 2 * _DRAIN_TIMEOUT)

    def _on_loop_end(self) -> None:
        """The event loop the collector started on is ending with the collector open: released now, and warned."""
        self._abandon(CloseReason.LOOP_ENDED, warn=True)

    def _abandon(self, reason: CloseReason, *, warn: bool) -> None:
        """Releases everything without waiting (nothing can be awaited on the collector's loop) and closes."""
        lifecycle = self._lifecycle
        if lifecycle.state is CollectorState.CLOSED:
            return
        held = lifecycle.state is not CollectorState.NEW  # NEW: nothing is built (a failed set-up was torn down)
        if lifecycle.state is not CollectorState.CLOSING:
            lifecycle.move(CollectorState.CLOSING, reason=reason)
        try:
            if held:
                self._release_now()
        except Exception:  # never from a finalizer: say it, and go on closing
            logger.exception("releasing %s without waiting failed", type(self).__name__)
        finally:
            lifecycle.move(CollectorState.CLOSED)
            self._tally.close_progress(self.stats())
        if warn and held:
            warn_unclosed(
                self,
                f"{type(self).__name__} was never shut down: {reason.value}; its workers were killed and everything it "
                "held released without waiting. Use `async with collector:` or `await collector.async_shutdown()`",
            )

    async def _close(self) -> None:
        for call in list(self._calls):
            call.scope.cancel()
        self._tasks.cancel_all()
        # The env must be closed only after the thread stepping it ended: wait for every call to leave.
        with anyio.move_on_after(_DRAIN_TIMEOUT):
            while self._calls:
                await self._changes.wait(0.1)
        if self._calls:
            logger.error("%d call(s) did not leave within %.0fs; tearing down under them", len(self._calls),
                         _DRAIN_TIMEOUT)  # fmt: skip
        await self._teardown()
        await self._tasks.aclose(_DRAIN_TIMEOUT)

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self: _Collector) -> _Collector:
        return self

    def __iter__(self) -> NoReturn:
        # Python's own "'Collector' object is not iterable" gives no hint that the batches come by `async for`.
        raise TypeError(
            f"a {type(self).__name__} is iterated with `async for batch in collector` (in an async function run by "
            "asyncio.run() or trio.run()), not `for`: its batches arrive without blocking the event loop. For one "
            "batch: `batch = await anext(collector)`"
        )

    def _ended(self) -> bool:
        """Whether the collector closed itself at the end of its ``total_frames``: iterating it ends at once."""
        return self._lifecycle.close_reason is CloseReason.EXHAUSTED

    async def __anext__(self) -> TensorDictBase:
        if self._ended():
            raise StopAsyncIteration
        batch = None
        try:
            batch = await self._next_batch()
        except ClosedCollectorError:
            if self._ended():  # another consumer took the last batch
                raise StopAsyncIteration from None
            raise
        if batch is None:
            if not self._lifecycle.entered:
                # total_frames collected, and no `async with` block owns the collector's life: nothing more can
                # come, so nothing is kept running for it (its workers, sockets and memory are released now).
                await self._shutdown(CloseReason.EXHAUSTED, raise_background_error=False)
            raise StopAsyncIteration
        return batch

    async def _next_batch(self) -> TensorDictBase | None:
        """The next batch, or ``None`` once ``total_frames`` were handed out."""
        batch = None
        with self._call("iterate"):
            if self._lifecycle.background:
                raise CollectorStateError(
                    "cannot iterate a collector that runs in the background (start() was called): "
                    "read from its replay buffer instead"
                )
            if self._lifecycle.state is CollectorState.PAUSED:
                raise CollectorStateError("cannot iterate a paused collector: leave the pause() block first")
            await self._consumer_turn()  # a second consumer waits its turn (and wakes at shutdown)
            try:
                if self.settings.trajs_per_batch is not None:
                    batch = await self._next_episodes()
                elif not self.exhausted:
                    await self._ensure_setup()
                    batch = await self._collect_checked()
                    self._count_frames(batch.numel())
                    self._tally.count_batch()
            finally:
                self._consumer_lock.release()
        return batch

    async def _consumer_turn(self) -> None:
        """Takes the consumer lock, at once where it is free under asyncio.

        anyio's lock yields to the event loop even when free: a loop iteration per batch, a tenth of the trainer's
        CPU on a small batch. The call checkpoints anyway where it waits for the batch. A lock held, or waited for,
        is waited for in turn; under trio the lock keeps its checkpoint.
        """
        loop = self._tasks.loop
        if loop is not None and loop.backend == "asyncio":
            try:
                self._consumer_lock.acquire_nowait()
                return
            except anyio.WouldBlock:
                pass
        await self._consumer_lock.acquire()

    async def _collect_checked(self) -> TensorDictBase:
        """One batch from ``_collect_batch``; its failure breaks the collector and is raised here, once."""
        return await self._checked(self._collect_batch)

    async def _checked(self, step: Callable[[], Awaitable[_T]]) -> _T:
        """``await step()`` (collecting, or user code on a batch); its failure breaks the collector and is raised
        here, once."""
        try:
            return await step()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            # An env, policy or worker failed mid-batch: what collects is in no known state.
            self._fail(exc)
            failure = self._lifecycle.failure
            if failure is not None and failure is not exc:
                # Broken by another failure first, or by what this one stands for (a worker that
                # lost its inference server reports the server's end): that one is the collector's.
                self._raise_failure()
            if failure is not None:
                self._lifecycle.report_failure()  # raised right here: never again at shutdown
            raise

    # -- whole episodes (trajs_per_batch) ------------------------------------------------------
    def _episode_assembler(self) -> TrajectoryAssembler:
        if self._assembler is None:
            self._assembler = TrajectoryAssembler(self._trajectory_id_stride())
        return self._assembler

    async def _next_episodes(self) -> TensorDictBase | None:
        """The next batch of ``trajs_per_batch`` whole episodes, from as many batches as it takes (see
        :mod:`acollect._batches.trajectory_batches`); at ``total_frames``, the episodes in progress, cut; ``None`` once
        every frame collected was handed out."""
        assembler = self._episode_assembler()
        while assembler.complete < (self.settings.trajs_per_batch or 1) and not self._collected_all():
            await self._ensure_setup()
            await self._assemble(assembler, await self._collect_checked())
        return await self._take_episodes(assembler)

    async def _assemble(self, assembler: TrajectoryAssembler, batch: TensorDictBase) -> None:
        """Adds a batch collected to ``assembler`` (a copy: lent memory goes back once the caller's reference
        goes) and counts its frames."""
        # Shielded: a batch collected is in the assembler whole, and counted (a copy: no wait to speak of).
        with anyio.CancelScope(shield=True):
            # (summed here: TensorDict.bytes() leaves a reference cycle that would hold lent memory until a gc)
            leaves = batch.values(include_nested=True, leaves_only=True)
            nbytes = sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
            if nbytes <= _INLINE_ASSEMBLY_BYTES:
                assembler.add(batch)
            else:  # pixels: milliseconds of copying, off the event loop
                await anyio.to_thread.run_sync(assembler.add, batch)
            self._count_frames(batch.numel())
            self._assembled(assembler)

    def _assembled(self, assembler: TrajectoryAssembler) -> None:
        """Hook: a batch was added to ``assembler`` (a collector whose workers may be lost ends their episodes)."""

    async def _take_episodes(self, assembler: TrajectoryAssembler) -> TensorDictBase | None:
        """``trajs_per_batch`` complete episodes as one batch, if there are as many; once ``total_frames`` were
        collected, up to as many of those left, the episodes in progress ended first (cut); else ``None``."""
        n = self.settings.trajs_per_batch
        assert n is not None
        final = self._collected_all()
        if final:
            assembler.flush()
        if assembler.complete < (1 if final else n):
            return None
        out = assembler.take(min(n, assembler.complete))
        self._tally.count_batch()
        postproc = self.settings.postproc
        if postproc is not None:  # user code: in a thread, as for the batches of a worker collector
            batch = out
            run = lambda: anyio.to_thread.run_sync(postproc, batch)  # noqa: E731
            # Its failure breaks the collector: raised to the caller here, or by the background task (whose failure
            # the next call reports).
            out = await (run() if self._lifecycle.background else self._checked(run))
        return out

    # -- background mode -------------------------------------------------------------------
    def start(
        self,
        replay_buffer: SupportsExtend | None = None,
        *,
        frames_per_update: float | None = None,
        learning_starts: int = 0,
        max_frames_ahead: int | None = None,
    ) -> Started:
        """Starts collecting in the background, extending ``replay_buffer`` batch after batch.

        Call it from a running event loop (asyncio or trio). The task belongs to the collector's task
        group: it stops at :meth:`async_shutdown`, and its failure is raised at the next call. A plain call, not
        a coroutine: the task runs once it returns. ``await collector.start(rb)`` works as well and returns at
        once, so either spelling is right.

        With ``frames_per_update``, the collector holds a replay ratio with the trainer, which reports its
        gradient updates with :meth:`trained` (so many more) or :meth:`trained_until` (a running total; see
        :mod:`acollect.collectors._background`): the collector never runs more than ``max_frames_ahead`` frames
        ahead of ``learning_starts + updates * frames_per_update``, and either call returns once the frames of the
        trainer's next update are in the buffer.

        Args:
            replay_buffer: any object with an ``extend(batch)`` method (an :class:`acollect.ReplayBuffer`, a
                torchrl ``ReplayBuffer``...), written as :func:`~acollect.replay_buffer.extend_from_loop` says.
            frames_per_update: frames collected per gradient update (DQN's ``train_freq``; below 1, several
                updates per frame, as SAC's update-to-data ratio above 1); ``None``: no ratio, the collector
                runs as fast as it can.
            learning_starts: frames collected before the first update counts (the buffer's warm-up).
            max_frames_ahead: how far ahead of the ratio the collector may run, in frames (default: one batch, or
                ``frames_per_update`` if that is more).

        Returns:
            A :class:`~acollect.collectors._background.Started` handle, already done: awaiting it returns at once.

        Raises:
            CollectorStateError: the collector was already started, or no event loop runs.
            ConfigurationError: ``replay_buffer`` has no ``extend`` method, or a bad ratio argument (named).

        Examples:
            >>> async def train(collector, rb, update):  # doctest: +SKIP
            ...     collector.start(rb, frames_per_update=4, learning_starts=1_000)  # DQN: one update per 4 frames
            ...     await collector.trained(updates=0)  # the warm-up is in the buffer
            ...     while not collector.exhausted:
            ...         update(rb.sample(64))
            ...         await collector.trained()  # one more update: returns once the next update's frames are in
        """
        self._check_usable("start()")
        if self._lifecycle.background:
            raise CollectorStateError("start() was already called on this collector")
        if replay_buffer is None or not callable(getattr(replay_buffer, "extend", None)):
            raise ConfigurationError.bad_value(
                "replay_buffer", replay_buffer, "an object with an extend(batch) method (e.g. acollect.ReplayBuffer)"
            )
        ratio = None
        if frames_per_update is not None:
            ahead = max_frames_ahead
            if ahead is None:
                try:
                    ahead = max(self.frames_per_batch, math.ceil(frames_per_update))
                except (TypeError, ValueError, OverflowError):
                    ahead = self.frames_per_batch  # a bad frames_per_update: ReplayRatio names it
            ratio = ReplayRatio(frames_per_update, learning_starts, ahead)
        elif learning_starts or max_frames_ahead is not None:
            raise ConfigurationError.bad_value(
                "frames_per_update", None, "a number of frames per update when learning_starts or max_frames_ahead "
                "is given (they are parts of the replay ratio)",
            )  # fmt: skip
        self._tasks.ensure_group()
        self._lifecycle.enter_background()
        self._run.started(ratio)
        self._tasks.spawn(self._run_background, replay_buffer, name="background")
        return Started()

    async def trained(self, *positional: Never, updates: int = 1) -> None:
        """Reports ``updates`` *more* gradient updates; returns once the frames of the trainer's next update are in.

        For a collector started with ``frames_per_update`` (see :meth:`start`): the trainer calls it after its
        updates, and the collector, waiting for the trainer when it runs ahead of the ratio, goes on. ``updates``
        counts the updates done since the last report, never a running total (that is :meth:`trained_until`):
        a keyword, so that the call says which it is. Returns at once once the collector collected its
        ``total_frames`` (no more frames will come).

        Args:
            updates: updates done since the last report (default one; ``0`` before the first update waits for
                ``learning_starts``).

        Raises:
            TypeError: the count was given by position (``trained(8)``, which reads as a running total too): the
                message names both spellings.
            ConfigurationError: ``updates`` is no int >= 0.
            CollectorStateError: the collector was not started, or started without ``frames_per_update``.
            ClosedCollectorError: the collector was shut down while this waited.

        Examples:
            >>> async def train(collector, rb, update):  # doctest: +SKIP
            ...     collector.start(rb, frames_per_update=4)
            ...     await collector.trained(updates=0)  # the warm-up is in the buffer
            ...     while not collector.exhausted:
            ...         for _ in range(8):
            ...             update(rb.sample(64))
            ...         await collector.trained(updates=8)  # eight more: 32 more frames are in
        """
        if positional:
            given = ", ".join(map(repr, positional))
            raise TypeError(
                f"trained({given}) is ambiguous: trained() takes the number of updates as a keyword. "
                f"`await collector.trained(updates={given})` reports {given} more updates (done since the last "
                f"report); `await collector.trained_until({given})` reports {given} updates in all since start()"
            )
        more = check_int("updates", updates)
        await self._report_updates("trained()", lambda ratio: more)

    async def trained_until(self, total: int) -> None:
        """Reports the trainer's running total of gradient updates; returns once the frames of its next one are in.

        The same as :meth:`trained` with the difference as ``updates``: for a trainer that counts its updates
        since :meth:`start` (an optimizer's step count, a global step) rather than since its last report.

        Args:
            total: the updates done since :meth:`start`, in all (``0`` before the first: waits for
                ``learning_starts``); never fewer than :attr:`updates`, the total reported so far.

        Raises:
            ConfigurationError: ``total`` is no int, or is below the updates already reported.
            CollectorStateError: the collector was not started, or started without ``frames_per_update``.
            ClosedCollectorError: the collector was shut down while this waited.

        Examples:
            >>> async def train(collector, rb, update):  # doctest: +SKIP
            ...     collector.start(rb, frames_per_update=4)
            ...     for step in range(10_000):
            ...         await collector.trained_until(step)  # step updates done: the frames of the next are in
            ...         update(rb.sample(64))
        """
        check_int("total", total)

        def more(ratio: ReplayRatio) -> int:
            if total < ratio.updates:
                raise ConfigurationError.bad_value(
                    "total", total,
                    f"at least the {ratio.updates} updates already reported: trained_until() takes the running "
                    "total since start(); trained(updates=n) reports n more",
                )  # fmt: skip
            return total - ratio.updates

        await self._report_updates("trained_until()", more)

    async def _report_updates(self, call: str, more: Callable[[ReplayRatio], int]) -> None:
        """Adds ``more(ratio)`` updates to the replay ratio; returns once the frames of the next update are in."""
        ratio = self._run.ratio
        if ratio is None:
            raise CollectorStateError(
                "trained() and trained_until() count the updates of a replay ratio: start the collector with "
                "start(replay_buffer, frames_per_update=...)"
            )
        ratio.add_updates(more(ratio))
        self._changes.notify()  # a collector waiting for the trainer may go on
        with self._call(call):
            while not ratio.trainer_may_update(self._tally.frames) and not self.exhausted and self._run.alive:
                await self._changes.wait()

    @property
    def updates(self) -> int:
        """Gradient updates the trainer reported since :meth:`start`, in all (0 without a replay ratio)."""
        return self._run.ratio.updates if self._run.ratio is not None else 0

    @property
    def running_in_background(self) -> bool:
        """Whether a background task started by :meth:`start` is alive."""
        return self._run.alive

    async def _run_background(self, replay_buffer: SupportsExtend) -> None:
        try:
            await self._ensure_setup()
            ratio = self._run.ratio
            while not self.exhausted:
                # Held by a pause, or ahead of the replay ratio: the trainer's pause exit or trained() wakes it.
                while self._lifecycle.pauses or (
                    ratio is not None and not ratio.collector_may_collect(self._tally.frames)
                ):
                    await self._changes.wait()
                self._run.batch_begun()
                try:
                    if self.settings.trajs_per_batch is not None:
                        # (no name holds the batch: its lent memory goes back once assembled)
                        await self._extend_with_episodes(replay_buffer, await self._collect_batch())
                        continue
                    batch = await self._collect_batch()
                    with anyio.CancelScope(shield=True):  # a batch that reached the buffer is in it whole, counted
                        await extend_from_loop(replay_buffer, batch)
                        self._count_frames(batch.numel())
                        self._tally.count_batch()
                finally:
                    self._run.batch_done()
                    self._changes.notify()
        finally:
            self._run.ended()

    async def _extend_with_episodes(self, replay_buffer: SupportsExtend, batch: TensorDictBase) -> None:
        """Background mode with ``trajs_per_batch``: ``batch`` assembled, and every batch of whole episodes it
        completes handed to ``replay_buffer``."""
        assembler = self._episode_assembler()
        await self._assemble(assembler, batch)
        del batch
        while (episodes := await self._take_episodes(assembler)) is not None:
            with anyio.CancelScope(shield=True):  # a batch that reached the buffer is in it whole
                await extend_from_loop(replay_buffer, episodes)

    @asynccontextmanager
    async def pause(self) -> AsyncIterator[None]:
        """Stops collection until the block exits; blocks may nest and overlap across tasks.

        Workers stop while any pause is held. In background mode, entering waits for the batch in flight
        to be handed to the replay buffer; inside the block no frame is collected (the buffer stops
        growing).

        Examples:
            >>> async def evaluate(collector):  # doctest: +SKIP
            ...     async with collector.pause():
            ...         ...  # the buffer does not grow here
        """
        self._check_usable("pause()")
        # Counted before any await, so two tasks entering at once both see the other's pause.
        self._lifecycle.hold_pause()
        try:
            with self._call("pause()"):
                # The background batch in flight is handed over first: workers paused before it
                # arrives would never send it.
                while self._run.busy:
                    await self._changes.wait()
                await self._sync_pause()
            yield
        finally:
            self._lifecycle.release_pause()
            if self._lifecycle.pauses == 0:
                self._changes.notify()
            if not self._lifecycle.closing:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_DRAIN_TIMEOUT):
                    await self._sync_pause()

    async def _sync_pause(self) -> None:
        """Brings the workers to the wanted pause state (paused iff a pause is held), one task at a time."""
        async with self._pause_lock:
            lifecycle = self._lifecycle
            wanted = lifecycle.pauses > 0
            if lifecycle.state in (CollectorState.RUNNING, CollectorState.PAUSED) and wanted != lifecycle.pause_applied:
                await self._apply_pause(wanted)
                lifecycle.pause_was_applied(wanted)
                self._tally.set_paused(wanted)
                if self._tally.shows_progress:
                    self._tally.show(self.stats())  # the display says "paused" at once, and when it goes on

    # -- weights -----------------------------------------------------------------------
    async def update_policy_weights_(
        self,
        policy_or_weights: torch.nn.Module | Weights | None = None,
        *,
        policy: torch.nn.Module | None = None,
        weights: Weights | None = None,
        weights_dict: Mapping[str, torch.nn.Module | Weights] | None = None,
        model_id: str = "policy",
        worker_ids: Sequence[int] | None = None,
        timeout: float = 30.0,
    ) -> int:
        """Hands new weights to the policy that collects; returns the new version once every target has them.

        They apply at the next batch boundary (between two forward passes for a policy in an inference server),
        so no batch mixes two versions, and every frame carries ``("collector", "policy_version")``. Give at
        most one of ``policy_or_weights``, ``policy``, ``weights`` and ``weights_dict``.

        Args:
            policy_or_weights: an ``nn.Module``, a TensorDict of weights (``TensorDict.from_module`` layout) or a
                state dict; none given: the weights of the ``policy`` given at construction.
            policy: keyword form for a module.
            weights: keyword form for weights.
            weights_dict: several models at once, ``{model_id: module or weights}``: one version, one message per
                worker, applied together (models other than ``"policy"``: worker processes only).
            model_id: what the weights are for in a worker: ``"policy"``, a path such as ``"policy.actor"``, or
                ``"env.<attribute>"`` (other than ``"policy"``: worker processes only).
            worker_ids: the workers to update (default: all; worker processes only, not torch.distributed).
            timeout: seconds to wait for the workers' acknowledgements.

        Raises:
            ConfigurationError: more than one source, weights that do not fit the policy (nothing changed; the
                message names the keys and shapes), or an argument this collector cannot honour.
            WeightSyncError: workers that did not acknowledge in time, or refused the weights (named in the error).
        """
        update = WeightUpdate.of(
            policy_or_weights, policy=policy, weights=weights, weights_dict=weights_dict, model_id=model_id,
            worker_ids=worker_ids, timeout=timeout,
        )  # fmt: skip
        return await self._update_policy_weights(update)

    # -- repr --------------------------------------------------------------------------
    def __repr__(self) -> str:
        total = "endless" if self.total_frames == -1 else self.total_frames
        return (
            f"{type(self).__name__}(state={self._lifecycle.state.name}, frames={self._tally.frames}/{total}, "
            f"frames_per_batch={self.frames_per_batch})"
        )
