"""AsyncCollector: one background process collecting ahead of the trainer.

It is a :class:`~acollect.MultiAsyncCollector` with a single worker: the env and
the policy live in another process, which keeps up to ``credits`` batches ready
while the trainer works, so stepping never competes with training for the
trainer's core (nor its GIL).
"""

from __future__ import annotations

from typing import Any

from typing_extensions import Unpack

from acollect.collectors.multi import MultiAsyncCollector
from acollect.collectors.options import ProcessOptions
from acollect.errors import ConfigurationError
from acollect.policy import PolicyLike

__all__ = ["AsyncCollector"]


class AsyncCollector(MultiAsyncCollector):
    """Collects in one background worker process; batches are ``[n_envs, T]`` as from :class:`~acollect.Collector`.

    Args:
        create_env_fn: an env, a gymnasium id, or a zero-argument callable returning an env.
        policy: the policy (sent to the worker), or ``None`` for random actions.
        credits: batches the worker may collect ahead of the trainer (default 2).
        **options: every other keyword argument of :class:`~acollect.MultiSyncCollector` but ``num_workers``
            and ``cat_results`` (``frames_per_batch``, ``total_frames``, devices, ``policy_factory``,
            ``filter_worker_warnings``...), checked as there.

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

    def __init__(
        self, create_env_fn: Any, policy: PolicyLike = None, *, credits: int = 2, **options: Unpack[ProcessOptions]
    ) -> None:
        if "num_workers" in options:  # not in ProcessOptions, so mypy flags it; this is for untyped callers
            raise ConfigurationError.bad_value(
                "num_workers",
                options["num_workers"],  # type: ignore[typeddict-item]
                "no value: an AsyncCollector has one worker (use MultiAsyncCollector for more)",
            )
        if isinstance(create_env_fn, (list, tuple)):
            raise ConfigurationError.bad_value(
                "create_env_fn", create_env_fn, "one env factory (use MultiAsyncCollector for a list)"
            )
        super().__init__([create_env_fn], policy, credits=credits, **options)
