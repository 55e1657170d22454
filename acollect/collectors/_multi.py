"""Collectors whose envs run in worker processes: :class:`MultiSyncCollector` and :class:`MultiAsyncCollector`.

Each worker is a process running the same rollout engine as the in-process
:class:`~acollect.Collector`; the event loop only moves messages (see
:mod:`acollect._workers`). Batches arrive as raw tensor frames or through
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

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._policy import PolicyLike
from acollect._weights.sync import WeightSyncScheme
from acollect._workers.launcher import Launcher
from acollect.collectors._collector_settings import MultiAsyncSettings, MultiSyncSettings
from acollect.collectors._keywords import keyword_errors, settings_from
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors._options import DEFAULT_START_METHOD, HEARTBEAT_TIMEOUT, Devices, Keys

__all__ = ["MultiAsyncCollector", "MultiSyncCollector"]

#: What MultiSyncCollector refuses, and why (another collector takes it).
_MULTI_SYNC_REFUSES = {
    "max_policy_lag": "a lockstep batch is collected by the version asked for it (at most one behind after a push, "
    "and every later one current): there is nothing stale to drop; MultiAsyncCollector takes it",
}


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
    (The worker pool's collector with the :class:`~acollect.collectors._dispatch.Lockstep` strategy;
    ``DistributedCollector`` and ``RayCollector`` take it with ``sync=True``.)

    Args:
        create_env_fn_list: one env factory per worker (a list), or one factory for ``num_workers`` workers.
            Each is an env, a gymnasium id, or a zero-argument callable returning an env; it is sent to the
            worker process with cloudpickle, so lambdas work.
        policy: the policy, sent to every worker (an ``nn.Module``, ``TensorDictModule``, callable or ``None``).

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.MultiSyncSettings` declares it.

    Raises:
        ConfigurationError: a bad argument (named in the message).
    """

    settings_class: ClassVar[type[MultiSyncSettings]] = MultiSyncSettings
    settings: MultiSyncSettings

    @keyword_errors(refused=_MULTI_SYNC_REFUSES)
    def __init__(
        self,
        create_env_fn_list: Any,
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
        launcher: str | Launcher = "local",
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Keys | None = None,
        copy_batches: bool = False,
        max_lent_bytes: int | None = None,
        cuda_dma: bool = False,
        filter_worker_warnings: bool = True,
        num_workers: int | None = None,
        worker_affinity: str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None = None,
        cat_results: str | int | None = None,
    ) -> None:
        super().__init__(create_env_fn_list, policy, settings_from(MultiSyncSettings, locals()))

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

    (The worker pool's collector with the :class:`~acollect.collectors._dispatch.FirstReady` strategy;
    ``DistributedCollector`` and ``RayCollector`` take it with ``sync=False``.)
    With ``copy_batches=False`` a batch that came through shared memory is handed out as the slot itself,
    with no copy at all: it is valid until the next iteration, when the slot goes back to its worker.

    Args:
        create_env_fn_list: one env factory per worker (a list), or one factory for ``num_workers`` workers
            (see :class:`MultiSyncCollector`).
        policy: the policy, sent to every worker (an ``nn.Module``, ``TensorDictModule``, callable or ``None``).

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.MultiAsyncSettings` declares it.

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

    @keyword_errors()
    def __init__(
        self,
        create_env_fn_list: Any,
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
        launcher: str | Launcher = "local",
        num_threads: int = 1,
        use_shared_memory: bool | None = None,
        remote_workers: int = 0,
        keys: Keys | None = None,
        copy_batches: bool = False,
        max_lent_bytes: int | None = None,
        cuda_dma: bool = False,
        filter_worker_warnings: bool = True,
        num_workers: int | None = None,
        worker_affinity: str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None = None,
        credits: int = 2,
        max_policy_lag: int | None = None,
    ) -> None:
        super().__init__(create_env_fn_list, policy, settings_from(MultiAsyncSettings, locals()))
