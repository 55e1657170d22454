"""RayCollector: TorchRL's Ray collector, as a multi-process collector whose workers are Ray actors.

It takes TorchRL's arguments and is built on the general mechanism: the worker pool of
the multi-process collectors with a :class:`~acollect.launchers.RayLauncher`, and the
dispatch strategy ``sync`` picks (:mod:`acollect.collectors.dispatch`): lockstep as
:class:`~acollect.MultiSyncCollector` (``sync=True``), or first ready as
:class:`~acollect.MultiAsyncCollector` (``sync=False``, TorchRL's default). Each
remote collector is one or more Ray actors that run the ordinary worker loop and
connect back to this process's ZeroMQ endpoint; batches and weights travel over that
endpoint, never through Ray's object store, so Ray only places and watches the actors.

Remote collectors that are themselves multi-worker collectors (TorchRL's
``collector_class=MultiSyncCollector`` with ``num_workers_per_collector``) become
``num_workers_per_collector`` actors each, all driven from here: one level of
fan-in instead of two, and a weight push goes to each actor directly instead of
cascading through a sub-collector.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import Unpack

from acollect._lifecycle import CloseReason
from acollect._validate import check_bool, check_int
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors.background import Started
from acollect.collectors.base import CollectorState
from acollect.collectors.collector import Collector
from acollect.collectors.collector_settings import RaySettings
from acollect.collectors.multi import MultiAsyncCollector, MultiSyncCollector
from acollect.collectors.options import DEVICE_OPTIONS, parse
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.launchers.ray import RayLauncher, RayWorker, check_remote_configs
from acollect.policy import PolicyLike

if TYPE_CHECKING:  # generated from the declarations, and only for mypy: regenerating it needs no import of it
    from acollect.collectors.option_types import RayOptions

__all__ = ["RayCollector"]

_COLLECTOR_CLASSES = (Collector, MultiSyncCollector, MultiAsyncCollector)
_COLLECTOR_NAMES = {"single": Collector, "sync": MultiSyncCollector, "async": MultiAsyncCollector}


def _none_if_negative(value: object) -> Any:
    # TorchRL spells "no limit" -1 where acollect spells it None.
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value < 0):
        return None
    return value


def _per_collector(name: str, value: Any, n_collectors: int) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != n_collectors:
            raise ConfigurationError.bad_value(
                name, value, f"one value, or a list of {n_collectors} (one per collector)"
            )
        return list(value)
    return [value] * n_collectors


class RayCollector(MultiCollectorBase):
    """Collects with remote collectors running as Ray actors (TorchRL's ``RayCollector`` arguments).

    One class, two modes: ``RayCollector(..., sync=True)`` takes batches as
    :class:`~acollect.MultiSyncCollector` does and yields one batch stacked from every remote collector;
    ``sync=False`` (the default, as in TorchRL) as :class:`~acollect.MultiAsyncCollector` does and yields
    each remote collector's batch as it is ready (:attr:`sync` says which). Either way it is iterated with
    ``async for``, runs in the background with :meth:`start`, and has :meth:`pause`,
    :meth:`update_policy_weights_`, :meth:`set_seed` and :meth:`state_dict`.

    Args:
        create_env_fn: one env factory per remote collector (a list), or one factory for ``num_collectors``.
        policy: the policy sent to every actor (or ``None`` for random actions).

    Keyword Args:
        frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part
            from each (``MultiSyncCollector``, ``sync=True``: each worker collects its share), else from one env or
            worker. Rounded up to a multiple of the number of envs, so that every env steps equally often (with a
            warning): ``collector.frames_per_batch`` then says what each batch holds,
            ``collector.requested_frames_per_batch`` what was asked. Required.
        total_frames (int): frames to collect in all, after which iteration ends; ``-1`` collects forever. Defaults to
            ``-1``.
        collector_class (Any): what each remote collector is: ``Collector`` (one actor), ``MultiSyncCollector`` or
            ``MultiAsyncCollector`` (``num_workers_per_collector`` actors each), a subclass of one, or its name
            ``"single"``, ``"sync"`` or ``"async"`` (checked by the RayCollector, which holds those classes). Defaults
            to ``'single'``.
        num_workers_per_collector (int): actors per remote collector, each with its own env from the same factory.
            Defaults to ``1``.
        num_collectors (int | None): number of remote collectors (``None``: ``len(create_env_fn)``, or 1). Defaults to
            ``None``.
        ray_init_config (Mapping[str, Any] | None): keyword arguments of ``ray.init`` (``None``: find a running cluster
            or start a local one); unused where Ray is initialized already. Defaults to ``None``.
        remote_configs (Mapping[str, Any] | Sequence[Mapping[str, Any]] | None): ``ray.remote`` options (``num_cpus``,
            ``num_gpus``, ``memory``...): one dict for every actor, or a list with one per remote collector (``None``:
            ``{"num_cpus": 1}`` per actor). Defaults to ``None``.
        replay_buffer (Any): :meth:`start` extends this buffer when it is called without one. Defaults to ``None``.
        shutdown_ray (bool): also ``ray.shutdown()`` when the collector shuts down (``async_shutdown()``, the end of
            ``async with``): for a collector that started Ray itself (``ray_init_config``). It ends every actor of this
            process, replay buffers' and other collectors' included, so only when nothing else uses Ray; ``shutdown()``
            can ask for it too. Defaults to ``False``.
        trust_policy (bool | None): TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that
            TorchRL code runs. Defaults to ``None``.
        use_env_creator (bool | None): TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that
            TorchRL code runs. Defaults to ``None``.
        no_cuda_sync (bool | None): TorchRL's, for a mechanism acollect does without: accepted, and ignored, so that
            TorchRL code runs. Defaults to ``None``.
        weight_updater (None): TorchRL's; only ``None``: weights reach the actors with ``update_policy_weights_()`` (and
            ``weight_sync_schemes``), acknowledged by each. Defaults to ``None``.
        weight_recv_schemes (None): TorchRL's; only ``None`` (see ``weight_updater``). Defaults to ``None``.
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
            multi-process collectors take a list too, with one device per worker. For a RayCollector, a list has one
            entry per remote collector (its actors share it). Defaults to ``None``.
        env_device (Devices): where env data lives; the multi-process collectors take a list too, with one device per
            worker. For a RayCollector, a list has one entry per remote collector (its actors share it). Defaults to
            ``None``.
        policy_device (Devices): where the policy runs (data is cast between it and the env device); the multi-process
            collectors take a list too, with one device per worker. For a RayCollector, a list has one entry per remote
            collector (its actors share it). Defaults to ``None``.
        storing_device (Devices): where batches land; the multi-process collectors take a list too, with one device per
            worker. For a RayCollector, a list has one entry per remote collector (its actors share it). Defaults to
            ``None``.
        max_frames_per_traj (int | None): truncate (``truncated=True``) and reset trajectories longer than this;
            ``None``: no limit. TorchRL's ``-1`` means ``None`` here too. Defaults to ``None``.
        init_random_frames (int | None): act randomly for this many frames first (``None``: 0). TorchRL's ``-1`` means
            ``None`` here too. Defaults to ``0``.
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
            ``policy_device``, ``reset_at_each_iter``, ``storing_device``. For a RayCollector, a list has one entry per
            remote collector (its actors share it). Defaults to ``None``.
        update_after_each_batch (bool): push the weights of ``policy`` (this process's copy) after every batch. Defaults
            to ``False``.
        max_weight_update_interval (int | None): push the weights of ``policy`` at least every this many batches
            (``None``: when asked only). TorchRL's ``-1`` means ``None`` here too. Defaults to ``None``.
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

    Raises:
        ConfigurationError: a bad argument (named in the message).

    Examples:
        >>> import anyio
        >>> from acollect import RayCollector
        >>> from acollect.testing import CountingEnv
        >>> async def main():  # doctest: +SKIP
        ...     async with RayCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=32, sync=True,
        ...                             ray_init_config={"num_cpus": 2}) as collector:
        ...         return [tuple(batch.shape) async for batch in collector]
        >>> anyio.run(main)  # doctest: +SKIP
        [(2, 1, 4), (2, 1, 4), (2, 1, 4), (2, 1, 4)]
    """

    settings_class: ClassVar[type[RaySettings]] = RaySettings
    settings: RaySettings

    def __init__(self, create_env_fn: Any, policy: PolicyLike = None, **options: Unpack[RayOptions]) -> None:
        opts: dict[str, Any] = dict(options)
        for name in ("max_frames_per_traj", "init_random_frames", "max_weight_update_interval"):
            if name in opts:
                opts[name] = _none_if_negative(opts[name])
        settings = parse(opts, self.settings_class, owner=type(self))
        self._check_class(settings.collector_class)
        #: whether shutting the collector down also shuts Ray down (``shutdown_ray``, or :meth:`shutdown`'s)
        self.shutdown_ray = settings.shutdown_ray
        k = settings.num_workers_per_collector
        env_fns = self._collector_env_fns(create_env_fn, settings.num_collectors)
        n = self.num_collectors = len(env_fns)
        remote_configs = settings.remote_configs
        configs = check_remote_configs(remote_configs, n if isinstance(remote_configs, (list, tuple)) else None)
        # Each collector's options are repeated for each of its actors.
        per_worker_configs = [c for c in configs for _ in range(k)] if isinstance(configs, list) else configs
        self._ray_launcher = RayLauncher(settings.ray_init_config, per_worker_configs)
        per_actor: dict[str, Any] = {
            name: [value for value in _per_collector(name, getattr(settings, name), n) for _ in range(k)]
            for name in (*DEVICE_OPTIONS, "collector_kwargs")
            if isinstance(getattr(settings, name), (list, tuple))
        }
        self._env_fn_list = [fn for fn in env_fns for _ in range(k)]
        settings = dataclasses.replace(settings, launcher=self._ray_launcher, **per_actor)
        super().__init__(self._env_fn_list, policy, settings)

    @property
    def collector_class(self) -> type:
        """What each remote collector is: ``Collector``, ``MultiSyncCollector`` or ``MultiAsyncCollector``."""
        return self._check_class(self.settings.collector_class)

    @property
    def num_workers_per_collector(self) -> int:
        """Actors per remote collector."""
        return self.settings.num_workers_per_collector

    @property
    def replay_buffer(self) -> Any:
        """The buffer :meth:`start` extends when it is called without one (``None``: none)."""
        return self.settings.replay_buffer

    @staticmethod
    def _check_class(collector_class: Any) -> type:
        if isinstance(collector_class, str) and collector_class in _COLLECTOR_NAMES:
            return _COLLECTOR_NAMES[collector_class]
        if isinstance(collector_class, type) and issubclass(collector_class, _COLLECTOR_CLASSES):
            return collector_class
        raise ConfigurationError.bad_value(
            "collector_class", collector_class,
            "Collector, MultiSyncCollector, MultiAsyncCollector (or a subclass), or 'single', 'sync', 'async'",
        )  # fmt: skip

    @staticmethod
    def _collector_env_fns(create_env_fn: Any, num_collectors: int | None) -> list[Any]:
        if isinstance(create_env_fn, (list, tuple)):
            fns = list(create_env_fn)
            if not fns:
                raise ConfigurationError.bad_value("create_env_fn", fns, "a non-empty list of env factories")
            if num_collectors is not None and num_collectors != len(fns):
                if len(fns) != 1:
                    raise ConfigurationError.bad_value(
                        "num_collectors", num_collectors, f"None or len(create_env_fn) = {len(fns)}"
                    )
                fns = fns * num_collectors
            return fns
        if create_env_fn is None:
            raise ConfigurationError.bad_value("create_env_fn", None, "an env factory or a list of them")
        return [create_env_fn] * (num_collectors or 1)

    # -- TorchRL's methods ---------------------------------------------------------------
    def add_collectors(
        self,
        create_env_fn: Any,
        num_envs: int = 1,
        policy: PolicyLike = None,
        collector_kwargs: Mapping[str, Any] | None = None,
        remote_configs: Mapping[str, Any] | None = None,
    ) -> None:
        """Adds ``num_envs`` remote collectors running ``create_env_fn``, before the collector starts.

        Args:
            create_env_fn: the env factory of the new collectors.
            num_envs: how many collectors to add.
            policy: must be ``None`` or the collector's own policy (every actor runs the same one).
            collector_kwargs: must be ``None`` or equal to the collector's (options are per collector at
                construction).
            remote_configs: ``ray.remote`` options of the new actors (default: those of the first actor).

        Raises:
            CollectorStateError: the collector started already (actors are placed once, at start).
            ConfigurationError: a bad argument.
        """
        if self.state is not CollectorState.NEW or self._pool is not None:
            raise CollectorStateError("add_collectors() must be called before the collector starts")
        check_int("num_envs", num_envs, minimum=1)
        if policy is not None and policy is not self._policy_arg:
            raise ConfigurationError.bad_value("policy", policy, "None (every actor runs the collector's policy)")
        if collector_kwargs is not None and collector_kwargs != self.settings.collector_kwargs:
            raise ConfigurationError.bad_value(
                "collector_kwargs", collector_kwargs, "None (collector options are set at construction)"
            )
        if isinstance(self.settings.collector_kwargs, list):
            raise ConfigurationError(
                "add_collectors() cannot extend per-collector collector_kwargs: pass a list for every collector "
                "at construction instead"
            )
        k = self.num_workers_per_collector
        new = (
            check_remote_configs(remote_configs) if remote_configs is not None else self._ray_launcher.remote_config(0)
        )
        assert isinstance(new, dict)
        old = self._ray_launcher.remote_configs
        fns = [*self._env_fn_list, *[create_env_fn] * (num_envs * k)]
        self._configs = self._plan(fns).configs  # checks the new factories (and device lists) before changing anything
        listed = old if isinstance(old, list) else [dict(old)] * len(self._env_fn_list)
        self._ray_launcher.remote_configs = [*listed, *[dict(new)] * (num_envs * k)]
        self._env_fn_list = fns
        self.num_collectors += num_envs

    @property
    def remote_collectors(self) -> list[Any]:
        """The Ray actor handles of the running workers (empty before start)."""
        if self._pool is None:
            return []
        return [h.process.actor for h in self._pool.handles if isinstance(h.process, RayWorker)]

    def start(self, replay_buffer: Any = None, **ratio: Any) -> Started:
        """Collects in the background into ``replay_buffer`` (default: the one given at construction); ``ratio``:
        the replay ratio's arguments, as for every collector (``frames_per_update``, ``learning_starts``,
        ``max_frames_ahead``)."""
        return super().start(replay_buffer if replay_buffer is not None else self.replay_buffer, **ratio)

    async def _setup(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError as exc:  # trio: Ray's asyncio API (ObjectRef awaits) has no trio road
            raise CollectorStateError(
                "RayCollector runs under asyncio only (it awaits Ray's asyncio API): start it from "
                "asyncio.run() or anyio.run(..., backend='asyncio')"
            ) from exc
        await super()._setup()

    async def _teardown(self) -> None:
        try:
            await super()._teardown()
        finally:
            # Only at the final shutdown: a set-up torn down after a cancellation or a failure leaves the
            # collector usable (NEW again), and Ray must stay up for its retry.
            if self.shutdown_ray and self.state is CollectorState.CLOSING:
                self._ray_launcher.shutdown_ray()

    def shutdown(self, timeout: float | None = None, shutdown_ray: bool = False) -> None:
        """Blocking :meth:`async_shutdown`, for code that has no event loop of its own.

        From another thread than the one whose event loop runs the collector, it waits (up to
        ``timeout`` plus a margin) for the shutdown to finish there.

        Args:
            timeout: the shutdown's deadline in seconds (default: ``shutdown_timeout``).
            shutdown_ray: also ``ray.shutdown()``, as if the collector had been built with
                ``shutdown_ray=True`` (``False`` keeps what construction asked for).

        Raises:
            CollectorStateError: called from inside a running event loop (``await async_shutdown()`` there).
            ConfigurationError: ``shutdown_ray`` is not a bool.
        """
        shutdown_ray = check_bool("shutdown_ray", shutdown_ray)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise CollectorStateError("shutdown() blocks: inside an event loop, await collector.async_shutdown()")
        if shutdown_ray:
            self.shutdown_ray = True  # the teardown applies it, on the collector's own event loop
        owner = self._tasks.loop
        try:
            if owner is None:
                asyncio.run(self.async_shutdown(timeout))  # never started: nothing runs that needs a loop
            elif owner.ended:
                # Its loop is gone (and with it every task; its end released the workers already, unless it was
                # only stopped): nothing left to await.
                self._abandon(CloseReason.SHUTDOWN, warn=False)
            else:
                limit = (timeout if timeout is not None else self.settings.shutdown_timeout) + 10.0
                owner.submit(lambda: self.async_shutdown(timeout))(limit)
        finally:
            if shutdown_ray:
                # The collector may have been shut down before this call (at the end of `async with`), its
                # teardown done without Ray's; ray.shutdown() is a no-op once Ray is down.
                self._ray_launcher.shutdown_ray()
