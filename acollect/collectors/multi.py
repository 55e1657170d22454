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

from typing import Any

from typing_extensions import Unpack

from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.dispatch import FirstReady, Lockstep
from acollect.collectors.options import WorkerOptions
from acollect.policy import PolicyLike

__all__ = ["MultiAsyncCollector", "MultiSyncCollector"]


class MultiSyncCollector(MultiCollectorBase):
    """Collects from several worker processes in lockstep and yields one batch from all of them.

    Each worker collects ``frames_per_batch / n_workers`` frames per batch, and a weight update made
    between two batches is in every frame of the next one. Workers begin the next batch while the trainer
    uses this one, except after a batch that a weight push (or ``set_seed``, ``load_state_dict``)
    preceded: a loop that pushes weights after every batch gets each batch collected when it asks for
    it. While the trainer waits for a batch, a worker whose part is in begins its part of the next one
    (run-ahead), so the fastest worker does not idle until the slowest one is done. A batch begun ahead
    before ``set_seed`` or ``load_state_dict`` is dropped (counted in ``stats().discarded_frames``) and
    collected anew; one begun before a weight push is handed out whole with the version that made it.
    (The worker pool's collector with the :class:`~acollect.collectors.dispatch.Lockstep` strategy;
    ``DistributedCollector`` and ``RayCollector`` take it with ``sync=True``.)

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
        use_shared_memory (bool | None): move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB
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
            kept. ``False``: a batch is lent, valid only until the next iteration (``clone()`` what must outlive
            it): through shared memory it is the segment the workers wrote it into, with no copy at all (batches
            sent as messages are combined into one buffer the collector reuses); this saves copying and
            allocating (and page-faulting) a new batch each time, which matters for large observations such as
            pixels.
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
        super().__init__(create_env_fn_list, policy, options, dispatch=Lockstep(cat_results))

    @property
    def cat_results(self) -> str | int | None:
        """How worker batches combine: ``None``/``"stack"``, ``0`` or ``-1`` (see the class docs)."""
        assert isinstance(self._dispatch, Lockstep)
        return self._dispatch.cat_results


class MultiAsyncCollector(MultiCollectorBase):
    """Collects in several worker processes ahead of the trainer; yields each worker's batch when it is ready.

    First ready, first served: a slow worker never holds the others back. Every batch is one worker's
    ``[n_envs, T]`` batch of ``frames_per_batch`` frames, tagged with ``("collector", "worker_id")``. Each
    worker may collect ``credits`` batches ahead; then it waits for the trainer (memory stays bounded).
    Weights pushed with :meth:`update_policy_weights_` apply from each worker's next batch boundary; batches
    collected before carry the older ``("collector", "policy_version")``.

    Takes the arguments of :class:`MultiSyncCollector` except ``cat_results``, plus ``credits`` (default 2).
    (The worker pool's collector with the :class:`~acollect.collectors.dispatch.FirstReady` strategy;
    ``DistributedCollector`` and ``RayCollector`` take it with ``sync=False``.)
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
        super().__init__(create_env_fn_list, policy, options, dispatch=FirstReady(credits))
