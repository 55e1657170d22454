"""Collectors whose envs run in worker processes: :class:`MultiSyncCollector` and :class:`MultiAsyncCollector`.

Each worker is a process running the same rollout engine as the in-process
:class:`~acollect.Collector`; the event loop only moves messages (see
:mod:`acollect.pool`). Batches arrive as raw tensor frames or through
shared-memory slots. By default every batch handed out is the caller's own memory
and stays valid after the next iteration; ``copy_batches=False`` trades that for
speed: the batch is lent, and valid only until the next iteration (see
``docs/workers.md``, "Who owns a batch").

Examples:
    >>> import anyio
    >>> from acollect import MultiSyncCollector
    >>> from acollect.testing import CountingEnv
    >>> async def main():
    ...     async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=16) as collector:
    ...         return [tuple(batch.shape) async for batch in collector]
    >>> anyio.run(main)
    [(2, 1, 4), (2, 1, 4)]
"""

from __future__ import annotations

import math
from typing import Any, cast

import anyio
import torch
from tensordict import TensorDictBase
from typing_extensions import Unpack

from acollect._validate import check_choice, check_int
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.options import WorkerOptions
from acollect.errors import ConfigurationError
from acollect.policy import PolicyLike
from acollect.pool import Received
from acollect.worker import protocol as P

__all__ = ["MultiAsyncCollector", "MultiSyncCollector"]

_CAT_RESULTS = (None, "stack", 0, -1)


class MultiSyncCollector(MultiCollectorBase):
    """Collects from several worker processes in lockstep and yields one batch from all of them.

    Each worker collects ``frames_per_batch / n_workers`` frames per batch, only when the trainer asks
    for the next batch, so a weight update made between two batches is in every frame of the next one.

    Args:
        create_env_fn_list: one env factory per worker (a list), or one factory for ``num_workers`` workers.
            Each is an env, a gymnasium id, or a zero-argument callable returning an env; it is sent to the
            worker process with cloudpickle, so lambdas work.
        policy: the policy, sent to every worker (an ``nn.Module``, ``TensorDictModule``, callable or ``None``).

    Keyword Args:
        policy_factory (callable | None): a zero-argument callable building the policy inside each worker instead.
        frames_per_batch (int): frames per batch from all workers together.
        total_frames (int): frames to collect in all; ``-1`` collects forever.
        num_workers (int | None): number of workers when ``create_env_fn_list`` is a single factory (default: CPU
            count).
        cat_results (str | int | None): ``None`` or ``"stack"`` stacks worker batches into ``[n_workers, n_envs,
            T]``; ``0`` concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time (``[n_envs,
            n_workers * T]``).
        collector_kwargs (dict | list[dict] | None): per-worker options (a dict for all, or a list of dicts, one per
            worker) among ``device``, ``env_device``, ``policy_device``, ``storing_device``,
            ``max_frames_per_traj``, ``init_random_frames``, ``reset_at_each_iter``, ``exploration_type``,
            ``env_kwargs``, ``num_threads``.
        device (device | list): as for :class:`~acollect.Collector`; one value, or a list with one per worker.
        env_device (device | list): likewise.
        policy_device (device | list): likewise.
        storing_device (device | list): likewise.
        max_frames_per_traj (int | None): as for :class:`~acollect.Collector`, applied in every worker.
        init_random_frames (int | None): likewise.
        reset_at_each_iter (bool): likewise.
        exploration_type (InteractionType | str | None): likewise.
        env_kwargs (dict | None): likewise.
        postproc (callable | None): applied in this process to each batch before it is handed out.
        split_trajs (bool): hand out padded trajectories (see :class:`~acollect.Collector`).
        update_after_each_batch (bool): push the weights of ``policy`` (this process's copy) after every batch.
        max_weight_update_interval (int | None): push them at least every this many batches.
        weight_sync_schemes (dict | None): model id -> :class:`~acollect.transport.weight_sync.WeightSyncScheme`.
        max_worker_restarts (int): restarts allowed per worker; ``0`` raises on the first crash.
        heartbeat_timeout (float): seconds a collecting worker may make no env step before it counts as hung.
        startup_timeout (float): seconds a worker may take to start and build its env and policy.
        shutdown_timeout (float): default deadline of :meth:`async_shutdown`.
        address (str | None): ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint
            (``None``: a private ipc path).
        start_method (str): ``"spawn"`` (fresh interpreters, default) or ``"forkserver"``.
        launcher (str | Launcher): where workers run: ``"local"`` (processes on this machine, default), ``"ray"``
            (one Ray actor each), ``"submitit"`` (one submitit job each), or a launcher instance such as
            ``RayLauncher(remote_configs=...)`` (see :mod:`acollect.launchers`). With Ray or submitit the collector
            binds ``tcp://<this node's address>:<free port>`` unless ``address`` says otherwise.
        num_threads (int): torch threads in each worker.
        use_shared_memory (bool | None): move batches through ``/dev/shm`` slots (``None``: for batches of 256 KiB
            or more on a local address).
        remote_workers (int): how many of the ``num_workers`` workers are started by hand (``acollect worker
            --connect ADDRESS --keys DIR``, on any machine) instead of by the collector: the last ones. The
            collector waits up to ``startup_timeout`` for them to join. Needs ``address`` and ``keys``.
        keys (str | ServerKeys | None): a key directory written by ``acollect keys`` (or a ``ServerKeys``): the
            endpoint then encrypts every connection with CURVE and accepts only the workers whose public key is in
            its ``authorized/`` directory; others are refused and counted in :attr:`rejected_peers`.
        progress (bool | str): show frames, frames/s and the mean episode return as collection goes (see
            :class:`~acollect.Collector`); the workers count episodes and send them with each batch.
        copy_batches (bool): ``True`` (default): each batch is fresh memory of its own, valid for as long as it is
            kept. ``False``: batches are combined into one buffer the collector reuses, so a batch is valid only
            until the next iteration (``clone()`` what must outlive it); this saves allocating (and page-faulting) a
            new batch each time, which matters for large observations such as pixels.
        filter_worker_warnings (bool): ignore Python warnings inside the workers (default ``True``: an env's
            deprecation warnings, repeated by every worker, would drown the trainer's output); ``False`` lets them
            through to the workers' stderr.

    Raises:
        ConfigurationError: a bad argument (named in the message).
    """

    def __init__(
        self,
        create_env_fn_list: Any,
        policy: PolicyLike = None,
        *,
        cat_results: str | int | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        self.cat_results = check_choice("cat_results", cat_results, _CAT_RESULTS)
        self._out: TensorDictBase | None = None  # the reused batch of copy_batches=False
        super().__init__(create_env_fn_list, policy, options)

    def _worker_frames(self, n_workers: int) -> int:
        return math.ceil(self.frames_per_batch / n_workers)

    def _credits(self) -> int | None:
        return None

    async def _collect_batch(self) -> TensorDictBase:
        pool = self._require_pool()
        await self._before_batch()
        for handle in pool.handles:
            if not handle.inbox and not handle.outstanding:
                handle.outstanding += 1
                # A restarted worker that has not said hello yet is not connected: it gets the request
                # with its hello (the pool resends outstanding requests then).
                if handle.ready:
                    await pool.send(handle, P.COLLECT)
        await pool.wait_until(lambda: all(h.inbox for h in pool.handles), what="a batch from every worker")
        items = [h.inbox.popleft() for h in pool.handles]
        try:
            # Off the event loop: combining (and postproc) of pixel batches takes milliseconds.
            batch = await anyio.to_thread.run_sync(self._combine_and_finish, [item.data for item in items])
        finally:
            for item in items:
                await self._release(item)
        return batch

    def _combine_and_finish(self, parts: list[TensorDictBase]) -> TensorDictBase:
        return self._finish(self._combine(parts))

    def _combine(self, parts: list[TensorDictBase]) -> TensorDictBase:
        stack = self.cat_results in (None, "stack")
        if not self.copy_batches and self._out is not None:
            try:  # into the batch handed out last time: warm memory, no allocation
                if stack:
                    return cast(TensorDictBase, torch.stack(parts, 0, out=self._out))  # type: ignore[arg-type]
                return cast(TensorDictBase, torch.cat(parts, int(self.cat_results), out=self._out))  # type: ignore[arg-type]
            except (RuntimeError, ValueError, KeyError):
                self._out = None  # the layout changed (a postproc kept a reference, a new key): start afresh
        try:
            if stack:
                batch = cast(TensorDictBase, torch.stack(parts, 0))  # type: ignore[arg-type]
            else:
                batch = cast(TensorDictBase, torch.cat(parts, int(self.cat_results)))  # type: ignore[arg-type]
        except (RuntimeError, ValueError) as exc:
            shapes = [tuple(p.shape) for p in parts]
            raise ConfigurationError.bad_value(
                "cat_results",
                self.cat_results,
                f"a way to combine worker batches of shapes {shapes} (stack needs equal shapes, 0 equal T, "
                f"-1 equal n_envs): {exc}",
            ) from exc
        if not self.copy_batches:
            self._out = batch
        return batch


class MultiAsyncCollector(MultiCollectorBase):
    """Collects in several worker processes ahead of the trainer; yields each worker's batch when it is ready.

    First ready, first served: a slow worker never holds the others back. Every batch is one worker's
    ``[n_envs, T]`` batch of ``frames_per_batch`` frames, tagged with ``("collector", "worker_id")``. Each
    worker may collect ``credits`` batches ahead; then it waits for the trainer (memory stays bounded).
    Weights pushed with :meth:`update_policy_weights_` apply from each worker's next batch boundary; batches
    collected before carry the older ``("collector", "policy_version")``.

    Takes the arguments of :class:`MultiSyncCollector` except ``cat_results``, plus ``credits`` (default 2).
    With ``copy_batches=False`` a batch that came through shared memory is handed out as the slot itself,
    with no copy at all: it is valid until the next iteration, when the slot goes back to its worker.

    Examples:
        >>> import anyio
        >>> from acollect import MultiAsyncCollector
        >>> from acollect.testing import CountingEnv
        >>> async def main():
        ...     async with MultiAsyncCollector([CountingEnv] * 2, frames_per_batch=4, total_frames=12) as collector:
        ...         ids = [int(b["collector", "worker_id"][0, 0]) async for b in collector]
        ...         return len(ids), set(ids) <= {0, 1}
        >>> anyio.run(main)
        (3, True)
    """

    def __init__(
        self, create_env_fn_list: Any, policy: PolicyLike = None, *, credits: int = 2, **options: Unpack[WorkerOptions]
    ) -> None:
        self._credit_count = check_int("credits", credits, minimum=1)
        super().__init__(create_env_fn_list, policy, options)

    def _worker_frames(self, n_workers: int) -> int:
        return self.frames_per_batch

    def _credits(self) -> int | None:
        return self._credit_count

    async def _setup(self) -> None:
        await super()._setup()
        pool = self._require_pool()
        pool.running = True
        pool.paused = self._pauses > 0
        await pool.broadcast(P.RUN, {"credits": self._credit_count})
        if pool.paused:
            await pool.broadcast(P.PAUSE)
        self._pause_applied = pool.paused

    async def _collect_batch(self) -> TensorDictBase:
        pool = self._require_pool()
        await self._before_batch()
        await pool.wait_until(lambda: pool.ready_queue, what="a batch from any worker")
        item = pool.ready_queue.popleft()
        try:
            # Off the event loop: a pixel batch's copy out of its slot takes milliseconds.
            batch = await anyio.to_thread.run_sync(self._hand_out, item)
        finally:
            await self._release(item, lend=item.in_slot and not self.copy_batches)
        return batch

    def _hand_out(self, item: Received) -> TensorDictBase:
        if not item.in_slot:
            batch = item.data  # over the message's own frames: already the caller's memory
        elif self.copy_batches:
            batch = item.data.clone()
        else:
            batch = item.data.copy()  # a new TensorDict over the slot's memory: the slot itself is lent
        batch.set(("collector", "worker_id"), torch.full(batch.shape, item.worker, dtype=torch.int64))
        return self._finish(batch)

    async def _apply_pause(self, paused: bool) -> None:
        # Workers abandon the batch in progress and wait; a restarted worker is told at its hello.
        pool = self._pool
        if pool is None or not pool.running or pool.endpoint is None or pool.endpoint.closed:
            return
        pool.paused = paused
        await pool.broadcast(P.PAUSE if paused else P.RESUME)
