"""What every collector shares: its public surface and its iteration, composed of the parts that own the rest.

A collector is an async iterator of batches and an async resource. This module owns what does not depend on
*where* envs run: iteration and ``total_frames``, over the collector's one task group (``_runtime/tasks.py``) and
its state machine (``_runtime/lifecycle.py``, which draws it). Each other job is a part it composes: ``Calls`` (the
rules for calling from several tasks, ``_calls.py``), ``Lifetime`` (set-up once, ``async_shutdown()``,
``_lifetime.py``), ``Pauses`` (``pause()``, ``_pause.py``), ``Background`` (``start()`` and the replay ratio,
``_background.py``), ``EpisodeBatches`` (``trajs_per_batch``, ``_episode_batches.py``). Subclasses implement
``_setup`` (build what collects), ``_collect_batch`` (one batch), ``_teardown`` and, where workers must be told,
``_apply_pause``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, ClassVar, NoReturn, TypeVar

import anyio
import torch
from tensordict import TensorDictBase
from typing_extensions import Never

from acollect._batches.counts import Counts
from acollect._batches.plan import BatchPlan
from acollect._runtime.lifecycle import CloseReason, CollectorState, Lifecycle
from acollect._runtime.notify import Notifier
from acollect._runtime.tasks import TaskOwner
from acollect._validate import check_total_frames
from acollect._weights.updates import WeightUpdate
from acollect.collectors._background import Background, Started
from acollect.collectors._calls import Calls
from acollect.collectors._episode_batches import EpisodeBatches
from acollect.collectors._hooks import CollectorHooks
from acollect.collectors._lifetime import Lifetime
from acollect.collectors._pause import Pauses
from acollect.errors import ClosedCollectorError, CollectorStateError
from acollect.replay_buffer import SupportsExtend
from acollect.stats import CollectorStats

if TYPE_CHECKING:
    from acollect._weights.updates import Weights
    from acollect.collectors._options import RolloutSettings

__all__ = ["CollectorBase", "CollectorState", "SupportsExtend"]

_Collector = TypeVar("_Collector", bound="CollectorBase")


class CollectorBase(CollectorHooks):
    """Shared lifecycle of all collectors (TorchRL calls it ``DataCollectorBase``).

    Subclasses name the class of their options (``settings_class``), call ``super().__init__(batch=...,
    total_frames=..., progress=...)`` with their :class:`~acollect._batches.plan.BatchPlan` and implement
    the hooks of :class:`~acollect.collectors._hooks.CollectorHooks`: ``_setup``, ``_collect_batch`` and
    ``_teardown`` at least. Its jobs besides iteration are parts it composes (the module's
    notes); its public methods for them hand over to those parts.
    """

    #: The class of this collector's checked options (``collector.settings``), which declares each keyword of its
    #: signature: its type, check and doc (the options reference is rendered from it).
    settings_class: ClassVar[type[RolloutSettings]]
    #: The options given, checked, every default filled in.
    settings: RolloutSettings

    def __init__(
        self, *, batch: BatchPlan, total_frames: int, progress: bool | str = False, shutdown_timeout: float = 30.0
    ) -> None:
        """``batch``: what each batch holds, settled as far as the arguments tell (see :meth:`_settle_batch`);
        ``shutdown_timeout``: the shutdown's deadline, unless ``async_shutdown(timeout)`` gives one."""
        self._batch = batch
        self.total_frames = check_total_frames(total_frames, batch.frames_per_batch)
        name = type(self).__name__
        # Frames, batches, statistics and the progress display: one part, counted only through its methods.
        self._counts = Counts(total_frames=self.total_frames, progress=progress, name=name)
        self._lifecycle = Lifecycle()  # the state, and all it depends on: read it, never keep a copy
        # A task that failed breaks the collector; the end of its event loop releases it without waiting.
        self._tasks = TaskOwner(
            name, on_failure=self._fail, on_loop_end=lambda: self._lifetime.abandon(CloseReason.LOOP_ENDED, warn=True)
        )
        self._changes = Notifier()  # calls leaving, pauses ending, the background batch handed over
        self._calls = Calls(name, self._lifecycle, self._tasks, self._changes, on_failure=self._fail)
        # trajs_per_batch: whole episodes gathered from the batches collected.
        self._episode_batches = EpisodeBatches(
            workers=self._trajectory_id_stride,
            counts=self._counts,
            count_frames=self._count_frames,
            collected_all=self._collected_all,
            added=self._assembled,
            checked=self._calls.checked,
        )
        self._background = Background(
            lifecycle=self._lifecycle,
            tasks=self._tasks,
            calls=self._calls,
            changes=self._changes,
            counts=self._counts,
            episodes=self._episode_batches,
            batch=self._batch,
            settings=lambda: self.settings,
            set_up=self._ensure_setup,
            collect=self._collect_batch,
            exhausted=lambda: self.exhausted,
            count_frames=self._count_frames,
        )
        self._pauses = Pauses(
            lifecycle=self._lifecycle,
            calls=self._calls,
            run=self._background.run,
            changes=self._changes,
            counts=self._counts,
            stats=self.stats,
            apply=self._apply_pause,
        )
        self._lifetime = Lifetime(
            self,
            lifecycle=self._lifecycle,
            tasks=self._tasks,
            calls=self._calls,
            pauses=self._pauses,
            counts=self._counts,
            stats=self.stats,
            setup=self._setup,
            teardown=self._teardown,
            release_now=self._release_now,
            limit=shutdown_timeout,
        )

    def _fail(self, exc: BaseException) -> None:
        """A task, a worker or a batch failed: the collector is BROKEN, every waiting call wakes with it (a
        collector may first say what the failure stands for, then call this)."""
        self._calls.fail(exc)

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
        ``total_frames`` is checked against it again (a warning where it is no multiple of it any more)."""
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
        return self._counts.frames

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
        return self._counts.snapshot(policy_version=int(getattr(self, "policy_version", 0)), counters=self._counters())

    def _count_frames(self, frames: int) -> None:
        """Counts ``frames`` collected (toward ``total_frames``), and shows them where progress is displayed."""
        self._counts.count_frames(frames)
        if self._counts.shows_progress:
            self._counts.show(self.stats())

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
        return self._collected_all() and self._episode_batches.empty

    def _collected_all(self) -> bool:
        return self.total_frames != -1 and self._counts.frames >= self.total_frames

    # -- set-up and shutdown (their part: acollect.collectors._lifetime) ---------------------
    async def _ensure_setup(self) -> None:
        """Sets the collector up once (see :mod:`acollect.collectors._lifetime`); every batch asks, at no cost."""
        if not self._lifecycle.set_up:
            await self._lifetime.set_up()

    async def __aenter__(self: _Collector) -> _Collector:
        self._lifecycle.enter()
        try:
            with self._calls.call("enter the collector"):  # a shutdown from another task ends the set-up too
                await self._ensure_setup()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.async_shutdown(raise_background_error=False)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._lifetime.shutdown(CloseReason.ASYNC_WITH, raise_background_error=exc_info[0] is None)

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
        await self._lifetime.shutdown(CloseReason.SHUTDOWN, timeout, raise_background_error=raise_background_error)

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
                await self._lifetime.shutdown(CloseReason.EXHAUSTED, raise_background_error=False)
            raise StopAsyncIteration
        return batch

    async def _next_batch(self) -> TensorDictBase | None:
        """The next batch, or ``None`` once ``total_frames`` were handed out."""
        batch = None
        with self._calls.call("iterate"):
            if self._lifecycle.background:
                raise CollectorStateError(
                    "cannot iterate a collector that runs in the background (start() was called): "
                    "read from its replay buffer instead"
                )
            if self._lifecycle.state is CollectorState.PAUSED:
                raise CollectorStateError("cannot iterate a paused collector: leave the pause() block first")
            await self._calls.take_turn()  # a second consumer waits its turn (and wakes at shutdown)
            try:
                n = self.settings.trajs_per_batch
                if n is not None:
                    batch = await self._episode_batches.next(n, self._collect_checked, self.settings.postproc)
                elif not self.exhausted:
                    batch = await self._collect_checked()
                    self._count_frames(batch.numel())
                    self._counts.count_batch()
            finally:
                self._calls.end_turn()
        return batch

    async def _collect_checked(self) -> TensorDictBase:
        """One batch from ``_collect_batch``, once set up; its failure breaks the collector and is raised here, once."""
        await self._ensure_setup()
        return await self._calls.checked(self._collect_batch)

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
        return self._background.start(replay_buffer, frames_per_update, learning_starts, max_frames_ahead)

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
        await self._background.trained(positional, updates)

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
        await self._background.trained_until(total)

    @property
    def updates(self) -> int:
        """Gradient updates the trainer reported since :meth:`start`, in all (0 without a replay ratio)."""
        return self._background.updates

    @property
    def running_in_background(self) -> bool:
        """Whether a background task started by :meth:`start` is alive."""
        return self._background.run.alive

    def pause(self) -> AbstractAsyncContextManager[None]:
        """Stops collection until the block exits; blocks may nest and overlap across tasks.

        Workers stop while any pause is held. In background mode, entering waits for the batch in flight
        to be handed to the replay buffer; inside the block no frame is collected (the buffer stops
        growing).

        Examples:
            >>> async def evaluate(collector):  # doctest: +SKIP
            ...     async with collector.pause():
            ...         ...  # the buffer does not grow here
        """
        return self._pauses.hold()

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
        sources = {"policy": policy, "weights": weights, "weights_dict": weights_dict}
        update = WeightUpdate.of(
            policy_or_weights, **sources, model_id=model_id, worker_ids=worker_ids, timeout=timeout
        )
        return await self._update_policy_weights(update)

    # -- repr --------------------------------------------------------------------------
    def __repr__(self) -> str:
        total = "endless" if self.total_frames == -1 else self.total_frames
        return (
            f"{type(self).__name__}(state={self._lifecycle.state.name}, frames={self._counts.frames}/{total}, "
            f"frames_per_batch={self.frames_per_batch})"
        )
