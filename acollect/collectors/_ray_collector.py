"""RayCollector: TorchRL's Ray collector, as a multi-process collector whose workers are Ray actors.

It takes TorchRL's arguments and is built on the general mechanism: the worker pool of
the multi-process collectors with a :class:`~acollect.launchers.RayLauncher`, and the
dispatch strategy ``sync`` picks (:mod:`acollect.collectors._dispatch`): lockstep as
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._policy import PolicyLike
from acollect._runtime.lifecycle import CloseReason
from acollect._validate import check_bool, check_int
from acollect._weights.sync import WeightSyncScheme
from acollect._workers.ray_launcher import RayLauncher, RayWorker, check_remote_configs
from acollect.collectors._background import Started
from acollect.collectors._base import CollectorState
from acollect.collectors._collector import Collector
from acollect.collectors._collector_settings import RaySettings
from acollect.collectors._keywords import keyword_errors, settings_from
from acollect.collectors._multi import MultiAsyncCollector, MultiSyncCollector
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors._options import DEFAULT_START_METHOD, DEVICE_OPTIONS, HEARTBEAT_TIMEOUT, Devices, Keys
from acollect.collectors._worker_configs import plan_workers
from acollect.errors import CollectorStateError, ConfigurationError

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


_RAY_ACTORS = (
    "a RayCollector's workers are Ray actors, set by create_env_fn, num_collectors and num_workers_per_collector"
)
#: What RayCollector refuses, and why.
_RAY_REFUSES = {
    "launcher": _RAY_ACTORS,
    "num_workers": _RAY_ACTORS,
    "worker_affinity": "a RayCollector's workers are Ray actors, placed by Ray on any node of its cluster: ask Ray "
    "for their CPUs with remote_configs ({'num_cpus': ...})",
}


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
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.RaySettings` declares it.

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

    @keyword_errors(refused=_RAY_REFUSES)
    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_factory: Callable[[], PolicyLike] | str | None = None,
        device: Devices | None = None,
        env_device: Devices | None = None,
        policy_device: Devices | None = None,
        storing_device: Devices | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        env_errors: str = "raise",
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        trajs_per_batch: int | None = None,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        env_kwargs: Mapping[str, Any] | None = None,
        progress: bool | str = False,
        collector_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int | None = None,
        weight_sync_schemes: Mapping[str, WeightSyncScheme] | None = None,
        max_worker_restarts: int = 0,
        on_worker_loss: str = "raise",
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 5.0,
        address: str | None = None,
        start_method: str = DEFAULT_START_METHOD,
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Keys | None = None,
        copy_batches: bool = False,
        max_lent_bytes: int | None = None,
        cuda_dma: bool = False,
        filter_worker_warnings: bool = True,
        credits: int | None = None,
        max_policy_lag: int | None = None,
        cat_results: str | int | None = None,
        sync: bool = False,
        collector_class: Any = "single",
        num_workers_per_collector: int = 1,
        num_collectors: int | None = None,
        ray_init_config: Mapping[str, Any] | None = None,
        remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        replay_buffer: Any | None = None,
        shutdown_ray: bool = False,
        trust_policy: bool | None = None,
        use_env_creator: bool | None = None,
        no_cuda_sync: bool | None = None,
        weight_updater: None = None,
        weight_recv_schemes: None = None,
    ) -> None:
        values = dict(locals())
        for name in ("max_frames_per_traj", "init_random_frames", "max_weight_update_interval"):
            values[name] = _none_if_negative(values[name])
        settings = settings_from(RaySettings, values)
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
            "collector_class",
            collector_class,
            "Collector, MultiSyncCollector, MultiAsyncCollector (or a subclass), or 'single', 'sync', 'async'",
        )

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
        policy, settings = self._worker_policy()
        # Checks the new factories (and device lists) before changing anything.
        self._configs = plan_workers(fns, policy, settings, stacked=self.sync).configs
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
        except RuntimeError as exc:  # trio: Ray's asyncio API (ObjectRef awaits) has no trio counterpart
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
                self._lifetime.abandon(CloseReason.SHUTDOWN, warn=False)
            else:
                limit = (timeout if timeout is not None else self.settings.shutdown_timeout) + 10.0
                owner.submit(lambda: self.async_shutdown(timeout))(limit)
        finally:
            if shutdown_ray:
                # The collector may have been shut down before this call (at the end of `async with`), its
                # teardown done without Ray's; ray.shutdown() is a no-op once Ray is down.
                self._ray_launcher.shutdown_ray()
