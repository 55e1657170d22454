"""AsyncCollector: one background process collecting ahead of the trainer.

It is a :class:`~acollect.MultiAsyncCollector` with a single worker: the env and
the policy live in another process, which keeps up to ``credits`` batches ready
while the trainer works, so stepping never competes with training for the
trainer's core (nor its GIL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from acollect._policy import PolicyLike
from acollect._weights.sync import WeightSyncScheme
from acollect._workers.launcher import Launcher
from acollect.collectors._collector_settings import MultiAsyncSettings
from acollect.collectors._keywords import keyword_errors, settings_from
from acollect.collectors._multi import MultiAsyncCollector
from acollect.collectors._multi_base import MultiCollectorBase
from acollect.collectors._options import DEFAULT_START_METHOD, HEARTBEAT_TIMEOUT, Devices, Keys
from acollect.errors import ConfigurationError

__all__ = ["AsyncCollector"]

#: What AsyncCollector refuses, and why (MultiAsyncCollector takes it).
_ASYNC_REFUSES = {
    "num_workers": "an AsyncCollector has one worker (use MultiAsyncCollector for more)",
    "on_worker_loss": "an AsyncCollector has one worker: once it is lost none is left to collect on with, so its "
    "loss always breaks the collector (MultiAsyncCollector takes it)",
}


class AsyncCollector(MultiAsyncCollector):
    """Collects in one background worker process; batches are ``[n_envs, T]`` as from :class:`~acollect.Collector`.

    Args:
        create_env_fn: an env, a gymnasium id, or a zero-argument callable returning an env.
        policy: the policy (sent to the worker), or ``None`` for random actions.

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._collector_settings.MultiAsyncSettings` declares it
            (but ``num_workers`` and ``on_worker_loss``: one worker).

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

    @keyword_errors(refused=_ASYNC_REFUSES)
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
        worker_affinity: str | Sequence[set[int] | frozenset[int] | Sequence[int]] | None = None,
        credits: int = 2,
        max_policy_lag: int | None = None,
    ) -> None:
        if isinstance(create_env_fn, (list, tuple)):
            raise ConfigurationError.bad_value(
                "create_env_fn", create_env_fn, "one env factory (use MultiAsyncCollector for a list)"
            )
        # MultiAsyncCollector's own __init__ only builds these settings, from the keywords it takes (num_workers
        # among them): one worker's are built here.
        MultiCollectorBase.__init__(self, [create_env_fn], policy, settings_from(MultiAsyncSettings, locals()))
