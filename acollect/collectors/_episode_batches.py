"""``trajs_per_batch``: the collector's batches gathered into whole episodes, handed out N at a time.

Every collector kind takes ``trajs_per_batch=N``. Its batches are collected as always, then copied into a
:class:`~acollect._batches.trajectory_batches.TrajectoryAssembler` (how episodes are cut and joined across batches
and workers is said there), and handed out as batches of N complete episodes, by iteration or to the replay buffer
of ``start()``. Once ``total_frames`` were collected, the episodes in progress are ended, cut, and handed out too:
every frame collected is handed out once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import anyio
import torch
from tensordict import TensorDictBase

from acollect._batches.counts import Counts
from acollect._batches.trajectory_batches import TrajectoryAssembler
from acollect.replay_buffer import SupportsExtend, extend_from_loop

__all__ = ["EpisodeBatches"]

#: Batches of more bytes are cut into episodes in a thread: a CartPole batch of 2,048 frames (140 KiB, a hundred
#: episode pieces) takes 2-4 ms, which the event loop's other tasks (heartbeats, a sampler) would wait for.
_INLINE_ASSEMBLY_BYTES = 1 << 16

Postproc = Callable[[TensorDictBase], TensorDictBase]


async def _postprocess(postproc: Postproc, batch: TensorDictBase) -> TensorDictBase:
    """``postproc(batch)``: user code, in a thread, as for the batches of a worker collector."""
    return await anyio.to_thread.run_sync(postproc, batch)


class EpisodeBatches:
    """Whole episodes gathered from one collector's batches (see the module's notes); made at the first batch.

    Its one user is its collector, one task at a time (under the consumers' turn, or in the background task).

    Args:
        workers: the collector's ``_trajectory_id_stride`` (the step between one worker's trajectory ids), asked
            once, at the first batch.
        counts: the collector's counts (a batch of episodes handed out is counted there).
        count_frames: counts the frames of a batch added (toward ``total_frames``).
        collected_all: whether ``total_frames`` were collected (the episodes in progress are ended then).
        added: the collector's ``_assembled`` hook, after each batch added.
        checked: runs a step whose failure breaks the collector and is raised to the caller, once (the
            collector's :meth:`Calls.checked <acollect.collectors._calls.Calls.checked>`).
    """

    __slots__ = ("_added", "_assembler", "_checked", "_collected_all", "_count_frames", "_counts", "_workers")

    def __init__(
        self,
        *,
        workers: Callable[[], int],
        counts: Counts,
        count_frames: Callable[[int], None],
        collected_all: Callable[[], bool],
        added: Callable[[TrajectoryAssembler], None],
        checked: Callable[[Callable[[], Awaitable[TensorDictBase]]], Awaitable[TensorDictBase]],
    ) -> None:
        self._workers = workers
        self._counts = counts
        self._count_frames = count_frames
        self._collected_all = collected_all
        self._checked = checked
        self._added = added
        self._assembler: TrajectoryAssembler | None = None

    @property
    def empty(self) -> bool:
        """Whether no frame collected waits to be handed out (in an episode complete or in progress)."""
        return self._assembler is None or self._assembler.empty

    def _episodes(self) -> TrajectoryAssembler:
        if self._assembler is None:
            self._assembler = TrajectoryAssembler(self._workers())
        return self._assembler

    async def next(
        self, n: int, collect: Callable[[], Awaitable[TensorDictBase]], postproc: Postproc | None
    ) -> TensorDictBase | None:
        """Iteration: the next batch of ``n`` whole episodes, from as many batches (``await collect()``) as it
        takes; at ``total_frames``, the episodes in progress, cut; ``None`` once every frame collected was handed
        out. Post-processed: a failure there breaks the collector, and is raised here."""
        assembler = self._episodes()
        while assembler.complete < n and not self._collected_all():
            await self.add(await collect())
        out = self.take(n)
        if out is None or postproc is None:
            return out
        return await self._checked(partial(_postprocess, postproc, out))

    async def add(self, batch: TensorDictBase) -> None:
        """Adds a batch collected (a copy: lent memory goes back once the caller's reference goes) and counts its
        frames."""
        assembler = self._episodes()
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
            self._added(assembler)

    def take(self, n: int) -> TensorDictBase | None:
        """``n`` complete episodes as one batch, if there are as many; once ``total_frames`` were collected, up to
        as many of those left, the episodes in progress ended first (cut); else ``None``."""
        assembler = self._episodes()
        final = self._collected_all()
        if final:
            assembler.flush()
        if assembler.complete < (1 if final else n):
            return None
        out = assembler.take(min(n, assembler.complete))
        self._counts.count_batch()
        return out

    async def extend(
        self,
        replay_buffer: SupportsExtend,
        batch: TensorDictBase,
        n: int,
        postproc: Postproc | None,
    ) -> None:
        """Background mode: ``batch`` added, and every batch of ``n`` whole episodes it completes handed to
        ``replay_buffer`` (post-processed: a failure there ends the background task, which breaks the collector)."""
        await self.add(batch)
        del batch
        while (episodes := self.take(n)) is not None:
            if postproc is not None:
                episodes = await _postprocess(postproc, episodes)
            with anyio.CancelScope(shield=True):  # a batch that reached the buffer is in it whole
                await extend_from_loop(replay_buffer, episodes)
