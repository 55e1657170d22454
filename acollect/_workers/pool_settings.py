"""What a worker pool is told once, at construction: one frozen object its parts share.

:class:`PoolSettings` holds what :class:`~acollect._workers.pool.WorkerPool` and its loops
(:class:`~acollect._workers.receive.Receiver`, :class:`~acollect._workers.liveness.Monitor`) need from the
collector's options and its dispatch strategy. Every field is required: the collector builds it from
its checked settings (:mod:`acollect.collectors._options`, where each option's default is declared), so
no default is repeated here and no part keeps a copy of a field.

Examples:
    >>> from acollect.launchers import LocalLauncher
    >>> settings = PoolSettings(
    ...     launcher=LocalLauncher(), address=None, keys=None, use_shared_memory=None, credits=2, slots=None,
    ...     shared_batches=None, heartbeat_timeout=30.0, startup_timeout=120.0, max_restarts=0,
    ...     on_worker_loss="raise", weight_sync_schemes={},
    ... )
    >>> settings.lockstep, settings.ring_slots
    (False, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from acollect._runtime.auth import ServerKeys
from acollect._weights.sync import WeightSyncScheme
from acollect._workers.launcher import Launcher

__all__ = ["PoolSettings"]


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """How a worker pool runs its workers: where, behind which endpoint, with which deadlines.

    Args:
        launcher: where workers run (local processes, Ray actors, submitit jobs).
        address: the endpoint's address (``None``: the launcher's default, a private ipc path for local workers).
        keys: CURVE keys of the endpoint (workers must hold an allowed key to connect), or ``None``.
        use_shared_memory: batches through ``/dev/shm`` slots; ``None`` decides by batch size and address.
        credits: batches each worker may collect ahead (``None``: one batch per ``collect`` request, lockstep).
        slots: shared-memory slots per worker, where batches go through them (``None``: ``credits``, or 1).
        shared_batches: ``"stack"`` or ``"cat"`` (lockstep): where every worker's batch goes through shared
            memory, each batch in flight is one segment that every worker writes its own rows of, stacked or
            concatenated along envs (:class:`~acollect._batches.shared_batches.SharedBatches`, ``slots`` of them);
            ``None``: a ring of slots per worker.
        heartbeat_timeout: seconds a worker may send no heartbeat, or make no env step while collecting, before
            it counts as hung.
        startup_timeout: seconds a worker may take to say hello (to join, for one started by hand).
        max_restarts: restarts allowed per worker before its death fails the pool (or loses the worker).
        on_worker_loss: ``"raise"``: a worker dead with its restarts spent fails the pool; ``"continue"``: once
            the pool runs, it is lost (:attr:`~acollect._workers.handles.WorkerState.LOST`) and the pool goes on with
            the others, failing only when none is left.
        weight_sync_schemes: how each model's weights travel, by model id; a model not named travels by the
            pool's default (:func:`~acollect._workers.weight_push.default_scheme`).
    """

    launcher: Launcher
    address: str | None
    keys: ServerKeys | None
    use_shared_memory: bool | None
    credits: int | None
    slots: int | None
    shared_batches: str | None
    heartbeat_timeout: float
    startup_timeout: float
    max_restarts: int
    on_worker_loss: str
    weight_sync_schemes: Mapping[str, WeightSyncScheme]

    @property
    def lockstep(self) -> bool:
        """Workers collect one batch per ``collect`` request (no credits), as lockstep collectors ask."""
        return self.credits is None

    @property
    def elastic(self) -> bool:
        """Whether a worker lost for good is dropped and the others collect on (``on_worker_loss="continue"``)."""
        return self.on_worker_loss == "continue"

    @property
    def ring_slots(self) -> int:
        """Shared-memory slots in a worker's own ring: ``slots``, else one per credit, else one."""
        return self.slots or self.credits or 1
