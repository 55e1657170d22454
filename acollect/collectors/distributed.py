"""Collectors whose batches and weights move over torch.distributed: :class:`DistributedCollector`
(``sync=False``: first ready, first served; ``sync=True``: lockstep) and :class:`DistributedSyncCollector`
(the same class with ``sync=True`` fixed).

They are the multi-process collectors with one change of road: control (commands,
heartbeats, batch headers, acknowledgements) stays on ZeroMQ, while the batch
tensors go worker -> collector with point-to-point sends and weight pushes go
collector -> workers with one broadcast, both through a torch.distributed process
group in which the collector is rank 0 and worker ``i`` is rank ``i + 1``
(:mod:`acollect.transport.torch_dist`; the pool that moves them is
:class:`acollect.pool.distributed.DistPool`). With ``backend="nccl"`` and CUDA batches,
a batch goes GPU to GPU without a host copy. Workers run wherever the launcher
puts them; every rank must reach ``init_method``.

A process group cannot take a new member once formed, so a worker that dies is
reported, never restarted (``max_worker_restarts`` must be 0), and one process
hosts one distributed collector at a time (torch.distributed's default group is
per process).

Examples:
    >>> import anyio
    >>> from acollect import DistributedCollector
    >>> from acollect.testing import CountingEnv
    >>> async def main():
    ...     async with DistributedCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=16, sync=True,
    ...                                     backend="gloo") as collector:
    ...         return collector.sync, [tuple(batch.shape) async for batch in collector]
    >>> anyio.run(main)
    (True, [(2, 1, 4), (2, 1, 4)])
"""

from __future__ import annotations

import dataclasses
import socket
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import Unpack

from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.collector_settings import DistributedSettings, DistributedSyncSettings
from acollect.collectors.options import parse
from acollect.errors import ConfigurationError
from acollect.policy import PolicyLike
from acollect.pool import WorkerPool
from acollect.pool.distributed import DistPool
from acollect.pool.settings import PoolSettings
from acollect.transport.weight_sync import WeightSyncScheme, ZmqWeightSyncScheme
from acollect.weights import WeightUpdate

if TYPE_CHECKING:  # generated from the declarations, and only for mypy: regenerating it needs no import of it
    from acollect.collectors.option_types import DistributedOptions, DistributedSyncOptions

__all__ = ["DistributedCollector", "DistributedSyncCollector"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class DistributedCollector(MultiCollectorBase):
    """Collects in worker processes whose batches and weights move over torch.distributed.

    One class, two modes: ``sync=False`` (default) takes batches as :class:`~acollect.MultiAsyncCollector`
    does (first ready, first served, each worker's batch tagged with its ``worker_id``); ``sync=True`` as
    :class:`~acollect.MultiSyncCollector` does (one part from every worker, all collected with the same
    weights, stacked or concatenated). The mode is the collector's dispatch strategy
    (:mod:`acollect.collectors.dispatch`); :class:`DistributedSyncCollector` is this class with
    ``sync=True`` fixed.

    Args:
        create_env_fn: one env factory per worker (a list), or one for ``num_workers`` workers.
        policy: the policy (see :class:`~acollect.MultiSyncCollector`).

    Keyword Args:
        frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part
            from each (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or
            worker. Rounded up to a multiple of the number of envs, so that every env steps equally often (with a
            warning): ``collector.frames_per_batch`` then says what each batch holds,
            ``collector.requested_frames_per_batch`` what was asked. Required.
        total_frames (int): frames to collect in all, after which iteration ends; ``-1`` collects forever. Defaults to
            ``-1``.
        backend (str): ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank) or ``"mpi"``: one this
            torch was built with. Defaults to ``'gloo'``.
        tcp_port (int | None): port of the rendezvous on ``master_addr`` (``None``: a free one). Defaults to ``None``.
        init_method (str | None): a torch.distributed init URL instead (``"tcp://host:port"``, ``"file:///path"``),
            without ``tcp_port``. Defaults to ``None``.
        master_addr (str): the collector's address as the workers reach it, for the rendezvous. Defaults to
            ``'127.0.0.1'``.
        dist_timeout (float): seconds any torch.distributed wait may take (rendezvous, one batch, one broadcast);
            torch's own default is 30 minutes. Defaults to ``60.0``.
        sync (bool): ``True``: lockstep batches, one part from every worker, all collected with the same weights,
            stacked or concatenated (as from ``MultiSyncCollector``); ``False``: each worker's batch, first ready, first
            served, tagged with its ``("collector", "worker_id")`` (as from ``MultiAsyncCollector``). Defaults to
            ``False``.
        cat_results (str | int | None): how worker batches combine: ``None`` or ``"stack"`` stacks them into
            ``[n_workers, n_envs, T]``; ``0`` concatenates along envs (``[n_workers * n_envs, T]``), ``-1`` along time
            (``[n_envs, n_workers * T]``). Only with ``sync=True``. Defaults to ``None``.
        credits (int): batches each worker may collect ahead of the trainer; then it waits for the trainer, so memory
            stays bounded. Only with ``sync=False``. Defaults to ``2``.
        max_policy_lag (int | None): the most policy versions a batch may be behind the collector's when it is handed
            out: a batch with a frame chosen by an older version is dropped (counted in ``stats().stale_batches``), its
            memory given back, and the next one taken; its worker's stream goes on with its next batch. ``None``: no
            limit (``stats().policy_lag`` says how far behind each batch was). Only with ``sync=False``. Defaults to
            ``None``.
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
        max_worker_restarts (int): restarts allowed per worker; ``0`` raises on the first crash. It must be 0 here: a
            torch.distributed process group cannot take a restarted worker in. Defaults to ``0``.
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

    Raises:
        ConfigurationError: a bad argument, the other mode's option, a backend torch does not have here, or
            ``max_worker_restarts``.
    """

    settings_class: ClassVar[type[DistributedSettings]] = DistributedSettings
    settings: DistributedSettings

    def __init__(self, create_env_fn: Any, policy: PolicyLike = None, **options: Unpack[DistributedOptions]) -> None:
        settings = parse(options, self.settings_class, owner=type(self))
        address, port = settings.master_addr, settings.tcp_port
        #: the torch.distributed init URL every rank joins (``init_method``, else the rendezvous on ``master_addr``)
        self.init_method = settings.init_method or f"tcp://{address}:{port or _free_port(address)}"
        super().__init__(create_env_fn, policy, settings)

    @property
    def backend(self) -> str:
        """The torch.distributed backend (``"gloo"``, ``"nccl"`` or ``"mpi"``)."""
        return self.settings.backend

    def _new_pool(self, settings: PoolSettings) -> WorkerPool:
        dist_options = {"backend": self.backend, "init_method": self.init_method, "timeout": self.settings.dist_timeout}
        return DistPool(self._configs, settings, on_failure=self._fail, dist_options=dist_options)

    def _default_scheme(self) -> WeightSyncScheme:
        return ZmqWeightSyncScheme()  # flat buffers, which the broadcast carries

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        # A broadcast reaches every worker of the process group: worker_ids may only name them all.
        if update.worker_ids is not None and sorted(set(update.worker_ids)) != list(range(self.num_workers)):
            raise ConfigurationError.bad_value(
                "worker_ids", list(update.worker_ids), "None: a broadcast reaches every worker of the process group"
            )
        return await super()._update_policy_weights(dataclasses.replace(update, worker_ids=None))


class DistributedSyncCollector(DistributedCollector):
    """:class:`DistributedCollector` with ``sync=True`` fixed: every batch holds one part from each worker,
    collected with the same weights (TorchRL's ``DistributedSyncDataCollector``).

    Takes the arguments of :class:`DistributedCollector` but ``sync`` and ``credits``; ``cat_results`` says
    how worker batches combine (see :class:`~acollect.MultiSyncCollector`).

    Args:
        create_env_fn: one env factory per worker (a list), or one for ``num_workers`` workers.
        policy: the policy (see :class:`~acollect.MultiSyncCollector`).

    Keyword Args:
        frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part
            from each (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or
            worker. Rounded up to a multiple of the number of envs, so that every env steps equally often (with a
            warning): ``collector.frames_per_batch`` then says what each batch holds,
            ``collector.requested_frames_per_batch`` what was asked. Required.
        total_frames (int): frames to collect in all, after which iteration ends; ``-1`` collects forever. Defaults to
            ``-1``.
        backend (str): ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank) or ``"mpi"``: one this
            torch was built with. Defaults to ``'gloo'``.
        tcp_port (int | None): port of the rendezvous on ``master_addr`` (``None``: a free one). Defaults to ``None``.
        init_method (str | None): a torch.distributed init URL instead (``"tcp://host:port"``, ``"file:///path"``),
            without ``tcp_port``. Defaults to ``None``.
        master_addr (str): the collector's address as the workers reach it, for the rendezvous. Defaults to
            ``'127.0.0.1'``.
        dist_timeout (float): seconds any torch.distributed wait may take (rendezvous, one batch, one broadcast);
            torch's own default is 30 minutes. Defaults to ``60.0``.
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
        max_worker_restarts (int): restarts allowed per worker; ``0`` raises on the first crash. It must be 0 here: a
            torch.distributed process group cannot take a restarted worker in. Defaults to ``0``.
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

    Raises:
        ConfigurationError: a bad argument, ``sync`` or ``credits``, a backend torch does not have here, or
            ``max_worker_restarts``.
    """

    settings_class: ClassVar[type[DistributedSyncSettings]] = DistributedSyncSettings
    settings: DistributedSyncSettings

    def __init__(
        self, create_env_fn: Any, policy: PolicyLike = None, **options: Unpack[DistributedSyncOptions]
    ) -> None:
        super().__init__(create_env_fn, policy, **options)
