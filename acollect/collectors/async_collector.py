"""AsyncCollector: one background process collecting ahead of the trainer.

It is a :class:`~acollect.MultiAsyncCollector` with a single worker: the env and
the policy live in another process, which keeps up to ``credits`` batches ready
while the trainer works, so stepping never competes with training for the
trainer's core (nor its GIL).
"""

from __future__ import annotations

from typing import Any

from acollect.collectors.multi import MultiAsyncCollector
from acollect.errors import ConfigurationError
from acollect.policy import PolicyLike

__all__ = ["AsyncCollector"]


class AsyncCollector(MultiAsyncCollector):
    """Collects in one background worker process; batches are ``[n_envs, T]`` as from :class:`~acollect.Collector`.

    Args:
        create_env_fn: an env, a gymnasium id, or a zero-argument callable returning an env.
        policy: the policy (sent to the worker), or ``None`` for random actions.
        **kwargs: every keyword argument of :class:`~acollect.MultiAsyncCollector` except ``num_workers``
            (``frames_per_batch``, ``total_frames``, ``credits``, devices, ``policy_factory``...).

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

    def __init__(self, create_env_fn: Any, policy: PolicyLike = None, **kwargs: Any) -> None:
        if "num_workers" in kwargs:
            raise ConfigurationError.bad_value(
                "num_workers",
                kwargs["num_workers"],
                "no value: an AsyncCollector has one worker (use MultiAsyncCollector for more)",
            )
        if isinstance(create_env_fn, (list, tuple)):
            raise ConfigurationError.bad_value(
                "create_env_fn", create_env_fn, "one env factory (use MultiAsyncCollector for a list)"
            )
        super().__init__([create_env_fn], policy, **kwargs)
