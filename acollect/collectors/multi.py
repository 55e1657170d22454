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

from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import Unpack

from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.collector_settings import MultiAsyncSettings, MultiSyncSettings
from acollect.collectors.options import parse
from acollect.policy import PolicyLike

if TYPE_CHECKING:  # generated from the declarations, and only for mypy: regenerating it needs no import of it
    from acollect.collectors.option_types import MultiAsyncOptions, MultiSyncOptions

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
        frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part
            from each (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or
            worker. Rounded up to a multiple of the number of envs, so that every env steps equally often (with a
            warning): ``collector.frames_per_batch`` then says what each batch holds,
            ``collector.requested_frames_per_batch`` what was asked. Required.
        total_frames (int): frames to collect in all, after which iteration ends; ``-1`` collects forever. Defaults to
            ``-1``.
        cat_results (str | int | None): how worker batches combine: ``None`` or ``"stack"`` stacks them into
            ``[n_workers, n_envs, T]``; ``0`` concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time
            (``[n_envs, n_workers * T]``). Defaults to ``None``.
        policy_factory (Callable[[], PolicyLike] | str | None): a zero-argument callable building the policy where it
            runs, instead of ``policy`` (for a policy that does not pickle). Multi-process collectors also take an
            import path ``'module:name'``, which each worker imports. Defaults to ``None``.
        device (Devices): fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the
            multi-process collectors take a list too, with one device per worker. Defaults to ``None``.
        env_device (Devices): where env data lives; the multi-process collectors take a list too, with one device per
            worker. Defaults to ``None``.
        policy_device (Devices): where the policy runs (data is cast between it and the env device); the multi-process
            collectors take a list too, with one device per worker. Defaults to ``None``.
        storing_device (Devices): where batches land; the multi-process collectors take a list too, with one device per
            worker. Defaults to ``None``.
        max_frames_per_traj (int | None): truncate (``truncated=True``) and reset trajectories longer than this;
            ``None``: no limit. Defaults to ``None``.
        init_random_frames (int | None): act randomly for this many frames first (``None``: 0). Defaults to ``0``.
        reset_at_each_iter (bool): reset every env at the start of each batch. Defaults to ``False``.
        env_errors (str): what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector
            with it (from a worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env
            from its factory (a vector env whole), where it runs (a worker process stays up), ends the episodes in
            flight as truncated at their last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the
            failed step yields no frame, and the next frames start new trajectories from a reset), counts it in
            ``stats().env_restarts`` and logs a warning with the exception on the ``acollect`` logger. An env that fails
            again after 3 rebuilds in a row with no step taken between them (its factory raises, or it raises before its
            first step each time) breaks the collector with its last exception. ``"restart"`` needs an env factory or a
            gymnasium id (not an env instance); the coroutine envs of an ``AsyncEnvPool`` are rebuilt one by one, by the
            pool, each ending its own episode. Defaults to ``'raise'``.
        postproc (Callable[[TensorDictBase], TensorDictBase] | None): a callable applied to each batch before it is
            handed out, in this process (in the collection thread, for ``Collector``). Defaults to ``None``.
        split_trajs (bool): hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of
            ``[n_envs, T]`` batches. Defaults to ``False``.
        trajs_per_batch (int | None): hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the
            longest, with a boolean ``("collector", "mask")`` (True on real frames), in the order they ended. Workers
            still collect ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames
            collected; when they are reached, the episodes in progress are handed out cut, truncated at their last frame
            (the last batch may hold fewer than N). ``None``: ``[n_envs, T]`` batches. Defaults to ``None``.
        exploration_type (InteractionType | str | None): tensordict interaction type used while collecting (an
            ``InteractionType`` or its name, such as ``"mode"``); set per collection thread and per worker, so
            collectors never change each other's. Defaults to ``InteractionType.RANDOM``.
        env_kwargs (Mapping[str, Any] | None): keyword arguments of the env factory, or of the env a gymnasium id names
            (such as ``{"num_envs": 8}``). Defaults to ``{}``.
        progress (bool | str): show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm
            bar if tqdm is installed, else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``,
            ``"log"`` or ``False`` (nothing shown). Workers count their episodes and send them with each batch. Defaults
            to ``False``.
        collector_kwargs (Mapping[str, Any] | Sequence[Mapping[str, Any]] | None): options per worker: one dict for
            every worker, or a list of dicts with one per worker, among ``device``, ``env_device``, ``env_errors``,
            ``env_kwargs``, ``exploration_type``, ``init_random_frames``, ``max_frames_per_traj``, ``num_threads``,
            ``policy_device``, ``reset_at_each_iter``, ``storing_device``. Defaults to ``None``.
        update_after_each_batch (bool): push the weights of ``policy`` (this process's copy) after every batch. Defaults
            to ``False``.
        max_weight_update_interval (int | None): push the weights of ``policy`` at least every this many batches
            (``None``: when asked only). Defaults to ``None``.
        weight_sync_schemes (Mapping[str, WeightSyncScheme] | None): how each model's weights travel: model id ->
            ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()`` (default: through shared memory to workers on
            this host, else over the endpoint). Defaults to ``{}``.
        max_worker_restarts (int): restarts allowed per worker; ``0`` raises on the first crash. Defaults to ``0``.
        on_worker_loss (str): what a worker lost for good does to the collector (one that dies with its
            ``max_worker_restarts`` spent, or a worker started by hand that leaves and is not replaced): ``"raise"``
            breaks the collector with the worker's error; ``"continue"`` drops the worker (a warning on the
            ``"acollect"`` logger, ``stats().lost_workers``, its state ``LOST``) and collects on with the others, a
            lockstep batch then holding the live workers' parts only; the collector breaks when no worker is left. It
            applies once every worker started. Defaults to ``'raise'``.
        heartbeat_timeout (float): seconds a collecting worker may make no env step (or any worker send no heartbeat)
            before it counts as hung; a worker with no parent process to watch (started by hand, or on another host)
            exits after as long without a word from its collector. Defaults to ``30.0``.
        startup_timeout (float): seconds a worker may take to start and build its env and policy (or to join, for one
            started by hand). Defaults to ``120.0``.
        shutdown_timeout (float): seconds :meth:`async_shutdown` takes at most, unless it is given a timeout. Defaults
            to ``5.0``.
        address (str | None): ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which
            workers connect to (``None``: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's
            address>:<free port>``). Defaults to ``None``.
        start_method (str): how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
            Defaults to ``'spawn'``.
        launcher (Any): where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each),
            ``"submitit"`` (one submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)``
            (see ``acollect.launchers``); checked together with ``start_method``. Defaults to ``'local'``.
        num_threads (int): torch threads in each worker. Defaults to ``1``.
        use_shared_memory (bool | None): move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or
            more on a local address). Defaults to ``None``.
        remote_workers (int): how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys
            DIR``, on any machine) instead of by the collector: the last ones. The collector waits up to
            ``startup_timeout`` for them to join. Needs ``address`` and ``keys``. Defaults to ``0``.
        keys (ServerKeys | str | os.PathLike[str] | None): a key directory written by ``acollect keys`` (or a
            ``ServerKeys``): the endpoint then encrypts every connection with CURVE and accepts only the workers whose
            public key is in its ``authorized/`` directory; others are refused and counted in ``rejected_peers``.
            Defaults to ``None``.
        copy_batches (bool): ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and
            never written while any tensor of it is held (a view, a slice, a numpy array of one), then given back to its
            worker (see ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once. Defaults to
            ``False``.
        max_lent_bytes (int | None): the most shared memory lent to the caller at once, in bytes: beyond it a batch is
            handed out as a copy (its memory given back at once), so a caller keeping every batch never stalls
            collection. ``None``: 1 GiB, or a quarter of ``/dev/shm`` where that is less. Defaults to ``None``.
        filter_worker_warnings (bool): ignore Python warnings inside the workers (an env's deprecation warnings,
            repeated by every worker, would drown the trainer's output); ``False`` lets them through to the workers'
            stderr. Defaults to ``True``.
        num_workers (int | None): the number of workers where ``create_env_fn_list`` is one factory (default: the CPU
            count). Defaults to ``None``.
        worker_affinity (str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None): the cores each worker
            process runs on (Linux; refused where ``os.sched_setaffinity`` is missing, such as macOS). ``None``
            (default): nothing is pinned, the OS places every process. ``"auto"``: worker ``i`` gets the ``i``-th core
            this process may use (``os.sched_getaffinity(0)`` at construction, round-robin when there are more workers
            than cores) and the trainer's threads the cores left, given back as they were at shutdown; with no core left
            (as many workers as cores), the trainer stays unpinned. A list places the workers by hand, one non-empty set
            of core ids per worker (``[{0}, {1}, {2, 3}]``), and leaves the trainer alone. Each worker pins itself at
            its start, before it builds its env (whose threads inherit the cores), and runs as many torch threads as it
            has cores, in place of ``num_threads``. Workers must run on this host (``launcher='local'``, no
            ``remote_workers``). Defaults to ``None``.

    Raises:
        ConfigurationError: a bad argument (named in the message).
    """

    settings_class: ClassVar[type[MultiSyncSettings]] = MultiSyncSettings
    settings: MultiSyncSettings

    def __init__(self, create_env_fn_list: Any, policy: PolicyLike = None, **options: Unpack[MultiSyncOptions]) -> None:
        super().__init__(create_env_fn_list, policy, parse(options, self.settings_class, owner=type(self)))

    @property
    def cat_results(self) -> str | int | None:
        """How worker batches combine: ``None``/``"stack"``, ``0`` or ``-1`` (see the class docs)."""
        return self.settings.cat_results


class MultiAsyncCollector(MultiCollectorBase):
    """Collects in several worker processes ahead of the trainer; yields each worker's batch when it is ready.

    First ready, first served: a slow worker never holds the others back. Every batch is one worker's
    ``[n_envs, T]`` batch of ``frames_per_batch`` frames, tagged with ``("collector", "worker_id")``. Each
    worker may collect ``credits`` batches ahead; then it waits for the trainer (memory stays bounded).
    Weights pushed with :meth:`update_policy_weights_` apply from each worker's next batch boundary; batches
    collected before carry the older ``("collector", "policy_version")``.

    (The worker pool's collector with the :class:`~acollect.collectors.dispatch.FirstReady` strategy;
    ``DistributedCollector`` and ``RayCollector`` take it with ``sync=False``.)
    With ``copy_batches=False`` a batch that came through shared memory is handed out as the slot itself,
    with no copy at all: it is valid until the next iteration, when the slot goes back to its worker.

    Args:
        create_env_fn_list: one env factory per worker (a list), or one factory for ``num_workers`` workers
            (see :class:`MultiSyncCollector`).
        policy: the policy, sent to every worker (an ``nn.Module``, ``TensorDictModule``, callable or ``None``).

    Keyword Args:
        frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part
            from each (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or
            worker. Rounded up to a multiple of the number of envs, so that every env steps equally often (with a
            warning): ``collector.frames_per_batch`` then says what each batch holds,
            ``collector.requested_frames_per_batch`` what was asked. Required.
        total_frames (int): frames to collect in all, after which iteration ends; ``-1`` collects forever. Defaults to
            ``-1``.
        credits (int): batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory
            stays bounded. Defaults to ``2``.
        max_policy_lag (int | None): the most policy versions a batch may be behind the collector's when it is handed
            out: a batch with a frame chosen by an older version is dropped (counted in ``stats().stale_batches``), its
            memory given back, and the next one taken; its worker's stream goes on with its next batch. ``None``: no
            limit (``stats().policy_lag`` says how far behind each batch was). Defaults to ``None``.
        policy_factory (Callable[[], PolicyLike] | str | None): a zero-argument callable building the policy where it
            runs, instead of ``policy`` (for a policy that does not pickle). Multi-process collectors also take an
            import path ``'module:name'``, which each worker imports. Defaults to ``None``.
        device (Devices): fills whichever of ``env_device``, ``policy_device`` and ``storing_device`` is not given; the
            multi-process collectors take a list too, with one device per worker. Defaults to ``None``.
        env_device (Devices): where env data lives; the multi-process collectors take a list too, with one device per
            worker. Defaults to ``None``.
        policy_device (Devices): where the policy runs (data is cast between it and the env device); the multi-process
            collectors take a list too, with one device per worker. Defaults to ``None``.
        storing_device (Devices): where batches land; the multi-process collectors take a list too, with one device per
            worker. Defaults to ``None``.
        max_frames_per_traj (int | None): truncate (``truncated=True``) and reset trajectories longer than this;
            ``None``: no limit. Defaults to ``None``.
        init_random_frames (int | None): act randomly for this many frames first (``None``: 0). Defaults to ``0``.
        reset_at_each_iter (bool): reset every env at the start of each batch. Defaults to ``False``.
        env_errors (str): what an exception from the env's ``step`` or ``reset`` does: ``"raise"`` breaks the collector
            with it (from a worker process, as a ``RemoteError`` with its traceback); ``"restart"`` rebuilds the env
            from its factory (a vector env whole), where it runs (a worker process stays up), ends the episodes in
            flight as truncated at their last step recorded (``("next", "truncated")`` and ``("next", "done")`` set; the
            failed step yields no frame, and the next frames start new trajectories from a reset), counts it in
            ``stats().env_restarts`` and logs a warning with the exception on the ``acollect`` logger. An env that fails
            again after 3 rebuilds in a row with no step taken between them (its factory raises, or it raises before its
            first step each time) breaks the collector with its last exception. ``"restart"`` needs an env factory or a
            gymnasium id (not an env instance); the coroutine envs of an ``AsyncEnvPool`` are rebuilt one by one, by the
            pool, each ending its own episode. Defaults to ``'raise'``.
        postproc (Callable[[TensorDictBase], TensorDictBase] | None): a callable applied to each batch before it is
            handed out, in this process (in the collection thread, for ``Collector``). Defaults to ``None``.
        split_trajs (bool): hand out ``[n_traj, T_max]`` padded trajectories with a ``("collector", "mask")`` instead of
            ``[n_envs, T]`` batches. Defaults to ``False``.
        trajs_per_batch (int | None): hand out batches of this many whole episodes, ``[N, L]`` padded with zeros to the
            longest, with a boolean ``("collector", "mask")`` (True on real frames), in the order they ended. Workers
            still collect ``frames_per_batch`` at a time underneath, and ``total_frames`` still counts the frames
            collected; when they are reached, the episodes in progress are handed out cut, truncated at their last frame
            (the last batch may hold fewer than N). ``None``: ``[n_envs, T]`` batches. Defaults to ``None``.
        exploration_type (InteractionType | str | None): tensordict interaction type used while collecting (an
            ``InteractionType`` or its name, such as ``"mode"``); set per collection thread and per worker, so
            collectors never change each other's. Defaults to ``InteractionType.RANDOM``.
        env_kwargs (Mapping[str, Any] | None): keyword arguments of the env factory, or of the env a gymnasium id names
            (such as ``{"num_envs": 8}``). Defaults to ``{}``.
        progress (bool | str): show frames, frames/s and the mean episode return as collection goes: ``True`` (a tqdm
            bar if tqdm is installed, else a log line every 10 s on the ``acollect.progress`` logger), ``"tqdm"``,
            ``"log"`` or ``False`` (nothing shown). Workers count their episodes and send them with each batch. Defaults
            to ``False``.
        collector_kwargs (Mapping[str, Any] | Sequence[Mapping[str, Any]] | None): options per worker: one dict for
            every worker, or a list of dicts with one per worker, among ``device``, ``env_device``, ``env_errors``,
            ``env_kwargs``, ``exploration_type``, ``init_random_frames``, ``max_frames_per_traj``, ``num_threads``,
            ``policy_device``, ``reset_at_each_iter``, ``storing_device``. Defaults to ``None``.
        update_after_each_batch (bool): push the weights of ``policy`` (this process's copy) after every batch. Defaults
            to ``False``.
        max_weight_update_interval (int | None): push the weights of ``policy`` at least every this many batches
            (``None``: when asked only). Defaults to ``None``.
        weight_sync_schemes (Mapping[str, WeightSyncScheme] | None): how each model's weights travel: model id ->
            ``ZmqWeightSyncScheme()`` or ``SharedMemWeightSyncScheme()`` (default: through shared memory to workers on
            this host, else over the endpoint). Defaults to ``{}``.
        max_worker_restarts (int): restarts allowed per worker; ``0`` raises on the first crash. Defaults to ``0``.
        on_worker_loss (str): what a worker lost for good does to the collector (one that dies with its
            ``max_worker_restarts`` spent, or a worker started by hand that leaves and is not replaced): ``"raise"``
            breaks the collector with the worker's error; ``"continue"`` drops the worker (a warning on the
            ``"acollect"`` logger, ``stats().lost_workers``, its state ``LOST``) and collects on with the others, a
            lockstep batch then holding the live workers' parts only; the collector breaks when no worker is left. It
            applies once every worker started. Defaults to ``'raise'``.
        heartbeat_timeout (float): seconds a collecting worker may make no env step (or any worker send no heartbeat)
            before it counts as hung; a worker with no parent process to watch (started by hand, or on another host)
            exits after as long without a word from its collector. Defaults to ``30.0``.
        startup_timeout (float): seconds a worker may take to start and build its env and policy (or to join, for one
            started by hand). Defaults to ``120.0``.
        shutdown_timeout (float): seconds :meth:`async_shutdown` takes at most, unless it is given a timeout. Defaults
            to ``5.0``.
        address (str | None): ``"ipc://<path>"`` or ``"tcp://<host>:<port>"`` for the collector's endpoint, which
            workers connect to (``None``: a private ipc path; with the Ray or submitit launcher, ``tcp://<this node's
            address>:<free port>``). Defaults to ``None``.
        start_method (str): how local worker processes start: ``"spawn"`` (fresh interpreters) or ``"forkserver"``.
            Defaults to ``'spawn'``.
        launcher (Any): where workers run: ``"local"`` (processes on this machine), ``"ray"`` (one Ray actor each),
            ``"submitit"`` (one submitit job each), or a launcher instance such as ``RayLauncher(remote_configs=...)``
            (see ``acollect.launchers``); checked together with ``start_method``. Defaults to ``'local'``.
        num_threads (int): torch threads in each worker. Defaults to ``1``.
        use_shared_memory (bool | None): move batches through ``/dev/shm`` slots (``None``: for batches of 32 KiB or
            more on a local address). Defaults to ``None``.
        remote_workers (int): how many of the workers are started by hand (``acollect worker --connect ADDRESS --keys
            DIR``, on any machine) instead of by the collector: the last ones. The collector waits up to
            ``startup_timeout`` for them to join. Needs ``address`` and ``keys``. Defaults to ``0``.
        keys (ServerKeys | str | os.PathLike[str] | None): a key directory written by ``acollect keys`` (or a
            ``ServerKeys``): the endpoint then encrypts every connection with CURVE and accepts only the workers whose
            public key is in its ``authorized/`` directory; others are refused and counted in ``rejected_peers``.
            Defaults to ``None``.
        copy_batches (bool): ``False`` (default): a batch is the workers' shared memory itself, lent with no copy and
            never written while any tensor of it is held (a view, a slice, a numpy array of one), then given back to its
            worker (see ``max_lent_bytes``). ``True``: each batch is a copy, its memory given back at once. Defaults to
            ``False``.
        max_lent_bytes (int | None): the most shared memory lent to the caller at once, in bytes: beyond it a batch is
            handed out as a copy (its memory given back at once), so a caller keeping every batch never stalls
            collection. ``None``: 1 GiB, or a quarter of ``/dev/shm`` where that is less. Defaults to ``None``.
        filter_worker_warnings (bool): ignore Python warnings inside the workers (an env's deprecation warnings,
            repeated by every worker, would drown the trainer's output); ``False`` lets them through to the workers'
            stderr. Defaults to ``True``.
        num_workers (int | None): the number of workers where ``create_env_fn_list`` is one factory (default: the CPU
            count). Defaults to ``None``.
        worker_affinity (str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None): the cores each worker
            process runs on (Linux; refused where ``os.sched_setaffinity`` is missing, such as macOS). ``None``
            (default): nothing is pinned, the OS places every process. ``"auto"``: worker ``i`` gets the ``i``-th core
            this process may use (``os.sched_getaffinity(0)`` at construction, round-robin when there are more workers
            than cores) and the trainer's threads the cores left, given back as they were at shutdown; with no core left
            (as many workers as cores), the trainer stays unpinned. A list places the workers by hand, one non-empty set
            of core ids per worker (``[{0}, {1}, {2, 3}]``), and leaves the trainer alone. Each worker pins itself at
            its start, before it builds its env (whose threads inherit the cores), and runs as many torch threads as it
            has cores, in place of ``num_threads``. Workers must run on this host (``launcher='local'``, no
            ``remote_workers``). Defaults to ``None``.

    Raises:
        ConfigurationError: a bad argument (named in the message).

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

    settings_class: ClassVar[type[MultiAsyncSettings]] = MultiAsyncSettings
    settings: MultiAsyncSettings

    def __init__(
        self, create_env_fn_list: Any, policy: PolicyLike = None, **options: Unpack[MultiAsyncOptions]
    ) -> None:
        super().__init__(create_env_fn_list, policy, parse(options, self.settings_class, owner=type(self)))
