"""AsyncCollector: one background process collecting ahead of the trainer.

It is a :class:`~acollect.MultiAsyncCollector` with a single worker: the env and
the policy live in another process, which keeps up to ``credits`` batches ready
while the trainer works, so stepping never competes with training for the
trainer's core (nor its GIL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import Unpack

from acollect._policy import PolicyLike
from acollect.collectors._collector_settings import AsyncSettings
from acollect.collectors._multi import MultiAsyncCollector
from acollect.errors import ConfigurationError

if TYPE_CHECKING:  # generated from the declarations, and only for mypy: regenerating it needs no import of it
    from acollect.collectors._generated_options import AsyncOptions

__all__ = ["AsyncCollector"]


class AsyncCollector(MultiAsyncCollector):
    """Collects in one background worker process; batches are ``[n_envs, T]`` as from :class:`~acollect.Collector`.

    Args:
        create_env_fn: an env, a gymnasium id, or a zero-argument callable returning an env.
        policy: the policy (sent to the worker), or ``None`` for random actions.

    Keyword Args:
        The options declared by :class:`~acollect.collectors._collector_settings.AsyncSettings`, each with its type, doc
        and default: generated into ``_generated_keyword_args.py`` and put here on import.

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
