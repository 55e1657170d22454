"""What a collector class implements: the hooks :class:`~acollect.collectors._base.CollectorBase` calls.

``CollectorBase`` owns iteration, the lifecycle and the parts every collector shares; a collector class fills in
these hooks, each with the job its docstring says (``_setup``, ``_collect_batch`` and ``_teardown`` at least), and
overrides nothing else of the base's (``tests/test_layers.py`` holds the rules for ``async_shutdown`` and
``update_policy_weights_``).
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from acollect._batches.trajectory_batches import TrajectoryAssembler
from acollect._weights.updates import WeightUpdate

__all__ = ["CollectorHooks"]


class CollectorHooks:
    """The hooks of a collector class, with what each does by default (nothing, where that is right)."""

    async def _setup(self) -> None:
        """Builds envs, policies, workers. Runs once, before the first batch; may spawn into ``self._tasks``."""

    async def _collect_batch(self) -> TensorDictBase:
        """Collects and returns one batch."""
        raise NotImplementedError

    async def _teardown(self) -> None:
        """Releases everything ``_setup`` built. Must be safe after a partial, cancelled or failed setup."""

    async def _apply_pause(self, paused: bool) -> None:
        """Tells whatever collects to stop (``True``) or go on (``False``); called with the pause lock held."""

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        """Puts the weights of a checked :meth:`update_policy_weights_` call in place; returns the new version."""
        raise NotImplementedError

    def _trajectory_id_stride(self) -> int:
        """The step between one worker's trajectory ids: the number of workers (worker ``k`` takes ``k, k + n...``)."""
        return 1

    def _release_now(self) -> None:
        """Releases everything ``_setup`` built without waiting: nothing can be awaited (the event loop ended, or
        the collector is being garbage collected). Workers are killed, sockets closed with ``linger=0``, shared
        memory unlinked. Must not block, nor raise."""

    def _counters(self) -> dict[str, Any]:
        """Hook: what a collector counted so far, by :class:`~acollect.CollectorStats` field (``restarts``,
        ``dropped_batches``, ``discarded_frames``, ``stale_batches``...); those left out are 0."""
        return {}

    def _assembled(self, assembler: TrajectoryAssembler) -> None:
        """Hook: a batch was added to ``assembler`` (a collector whose workers may be lost ends their episodes)."""
