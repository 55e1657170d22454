"""AsyncCollector: one background process collecting ahead of the trainer.

It is a :class:`~acollect.MultiAsyncCollector` with a single worker: the env and
the policy live in another process, which keeps up to ``credits`` batches ready
while the trainer works, so stepping never competes with training for the
trainer's core (nor its GIL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import Unpack

from acollect.collectors.collector_settings import AsyncSettings
from acollect.collectors.multi import MultiAsyncCollector
from acollect.errors import ConfigurationError
from acollect.policy import PolicyLike

if TYPE_CHECKING:  # generated from the declarations, and only for mypy: regenerating it needs no import of it
    from acollect.collectors.option_types import AsyncOptions

__all__ = ["AsyncCollector"]


class AsyncCollector(MultiAsyncCollector):
    """Collects in one background worker process; batches are ``[n_envs, T]`` as from :class:`~acollect.Collector`.

    Args:
        create_env_fn: an env, a gymnasium id, or a zero-argument callable returning an env.
        policy: the policy (sent to the worker), or ``None`` for random actions.

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
        >>> from acollect import AsyncCollector
        >>> async def main():
        ...     async with AsyncCollector("CartPole-v1", frames_per_batch=64, total_frames=128,
        ...                               env_kwargs={"num_envs": 4}) as collector:
        ...         return [tuple(batch.shape) async for batch in collector]
        >>> anyio.run(main)
        [(4, 16), (4, 16)]
    """

    settings_class: ClassVar[type[AsyncSettings]] = AsyncSettings
    settings: AsyncSettings

    def __init__(self, create_env_fn: Any, policy: PolicyLike = None, **options: Unpack[AsyncOptions]) -> None:
        if isinstance(create_env_fn, (list, tuple)):
            raise ConfigurationError.bad_value(
                "create_env_fn", create_env_fn, "one env factory (use MultiAsyncCollector for a list)"
            )
        super().__init__([create_env_fn], policy, **options)
