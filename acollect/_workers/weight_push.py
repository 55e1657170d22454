"""The collector's end of a weight push to worker processes: checked, serialized once, sent, acknowledged.

:class:`WeightPusher` owns what pushes share: the scheme each model travels by and its writer, the last
weights sent (a worker that says hello later gets them), the policy version, the lock that keeps two pushes
from interleaving, and each worker's answers (the version its process acknowledged, the last push it refused),
which the receive loop files here. Every collector of worker processes pushes through it: the check of the
weights against the policy each worker reported, the wire, the wait for the acks.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import anyio
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._batches.shm import shm_available
from acollect._devices import wait_ready
from acollect._runtime.threads import run_in_thread
from acollect._weights.sync import SharedMemWeightSyncScheme, WeightSyncScheme, WeightWriter, ZmqWeightSyncScheme
from acollect._weights.updates import check_push, streams_ready
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle
from acollect._workers.liveness import MONITOR_PERIOD
from acollect._workers.pool_events import PoolEvents
from acollect._workers.pool_settings import PoolSettings
from acollect.errors import WeightSyncError

__all__ = ["Send", "WeightPusher", "default_scheme"]

#: How the pool sends one command to one worker (see :meth:`acollect._workers.pool.WorkerPool.send`).
Send = Callable[[WorkerHandle, str, "Mapping[str, Any] | None", "TensorDictBase | None"], Awaitable[None]]


def default_scheme(settings: PoolSettings) -> WeightSyncScheme:
    """How weights reach workers where no scheme was named: through shared memory for workers on this host reached
    by ``ipc://`` (where the system has it), else in the push's message."""
    address = settings.address
    local = settings.launcher.same_host and (address is None or address.startswith("ipc://"))
    return SharedMemWeightSyncScheme() if local and shm_available() else ZmqWeightSyncScheme()


def _write(
    writer: WeightWriter, params: TensorDictBase, ready: tuple[Any, ...], _stop: object
) -> tuple[dict[str, Any], torch.Tensor | None]:
    # This thread's streams are not the caller's: CUDA weights are read once the work the caller queued before the
    # push (an optimizer step on a side stream) is done, or the workers would get them half-written.
    wait_ready(ready)
    return writer.write(params)


class WeightPusher:
    """Pushes weights to the pool's workers and waits for their acknowledgements.

    Args:
        handles: the pool's workers, by index.
        events: the pool's failure, and the changes a push waits on.
        send: how one command reaches one worker.
        schemes: how each model travels, by model id (``weight_sync_schemes``).
        default_scheme: how a model not in ``schemes`` travels.
        max_restarts: restarts allowed per worker (with none, a push waits for live workers only).
        elastic: a worker gone with its restarts spent is lost, not a failure (``on_worker_loss="continue"``): a push
            skips lost workers, and waits for the liveness loop to say whether a dead one is restarted or lost.
        first_unasked: the number of the first lockstep batch no worker was asked for yet: a push applies from
            it on every worker (a part asked of one worker ahead is collected by the version it was asked under,
            and so are the other parts of its batch, whenever they are asked for).
    """

    def __init__(
        self,
        handles: Sequence[WorkerHandle],
        events: PoolEvents,
        send: Send,
        *,
        schemes: Mapping[str, WeightSyncScheme],
        default_scheme: WeightSyncScheme,
        max_restarts: int,
        elastic: bool = False,
        first_unasked: Callable[[], int] = lambda: 1,
    ) -> None:
        self.handles = handles
        self._first_unasked = first_unasked
        self.events = events
        self.max_restarts = max_restarts
        self.elastic = elastic
        self.version = 0
        self._send = send
        self._schemes, self._default_scheme = dict(schemes), default_scheme
        self._writers: dict[str, WeightWriter] = {}
        # worker index -> (generation, version) its process acknowledged: a successor has acknowledged nothing
        self._acks: dict[int, tuple[int, int]] = {}
        self._refused: dict[int, tuple[int, str]] = {}  # worker index -> (version, why) of the last push refused
        self._last: tuple[dict[str, Any], TensorDictBase | None] | None = None
        self._lock = anyio.Lock()
        #: Held while a push's messages go out, and by a lockstep collector while it asks for a batch: every worker
        #: then gets a push before its request for any batch, or after every request of one (``from`` is right).
        self.order = anyio.Lock()

    @property
    def last(self) -> tuple[dict[str, Any], TensorDictBase | None] | None:
        """The last push's message (fields and tensors), for a worker that says hello after it."""
        return self._last

    def acked_version(self, handle: WorkerHandle) -> int:
        """The last weights version the worker's current process acknowledged (``0``: none yet)."""
        generation, version = self._acks.get(handle.index, (-1, 0))
        return version if generation == handle.generation else 0

    def refused(self, handle: WorkerHandle) -> tuple[int, str] | None:
        """``(version, why)`` of the last push the worker refused (it keeps its previous weights), any process."""
        return self._refused.get(handle.index)

    def on_ack(self, handle: WorkerHandle, header: Mapping[str, Any]) -> tuple[int, str] | None:
        """The worker acknowledged a push, or refused it (returns ``(version, why)`` then)."""
        if header.get("error") is not None:
            refused = self._refused[handle.index] = (int(header["version"]), str(header["error"])[:2000])
            return refused
        version = max(self.acked_version(handle), int(header["version"]))
        self._acks[handle.index] = (handle.generation, version)
        return None

    def close(self) -> None:
        """Releases the writers and the last weights. Idempotent."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._last = None

    async def push(
        self,
        models: Mapping[str, TensorDictBase],
        worker_ids: Sequence[int],
        limit: float,
        ready: tuple[Any, ...] = (),
        *,
        check: bool = True,
    ) -> int:
        """Checks ``models`` against the policy each of ``worker_ids`` reported in its hello, serializes them once,
        sends them and waits for every ACK.

        ``ready``: the events of :func:`~acollect._devices.cuda_ready` recorded on the caller's thread as it handed
        CUDA weights over; they are copied to the host only once the work queued before them is done.
        ``check=False`` skips the check here, as a peer of the workers that skipped it would (each worker checks
        what it gets against its own policy, and refuses what does not fit).

        Returns:
            The new policy version.

        Raises:
            ConfigurationError: weights that do not fit a worker's policy, named by key and shape; nothing was sent.
            WeightSyncError: some workers refused them, or did not acknowledge within ``limit`` seconds.
        """
        ready = ready or streams_ready(models)
        if check:
            models = check_push(models, [self.handles[i].hello.weights_structure for i in worker_ids])
        async with self._lock:
            failed = getattr(self.events.failure, "worker_id", None)
            # A pool broken by one worker still updates the others (they are alive and answer), so the
            # error below names exactly the workers without the weights; any other failure refuses at once.
            if self.events.failure is not None and not isinstance(failed, int):
                raise WeightSyncError(
                    f"cannot push weights: the collector is broken ({self.events.failure})",
                    worker_ids=list(worker_ids),
                ) from self.events.failure
            entries: list[dict[str, Any]] = []
            frames: dict[str, torch.Tensor] = {}
            for i, (model_id, params) in enumerate(models.items()):
                writer = self._writers.get(model_id)
                if writer is None:
                    scheme = self._schemes.get(model_id) or self._default_scheme
                    writer = self._writers[model_id] = scheme.make_writer()
                entry, flat = await run_in_thread(partial(_write, writer, params, ready), name="weights")
                entries.append({"id": model_id, **entry})
                if flat is not None:
                    frames[f"m{i}"] = flat
            self.version += 1
            version = self.version
            fields = {"version": version, "models": entries}
            td = TensorDict(frames, batch_size=[]) if frames else None
            self._last = (fields, td)
            # A lost worker is gone for good: nobody waits for its acknowledgement (nor names it in an error).
            targets = [self.handles[i] for i in worker_ids if not self.handles[i].lost]
            async with self.order:
                # Not in ``last``: a worker greeted with these weights (a successor) applies them at once.
                sent = {**fields, "from": self._first_unasked()}
                for handle in targets:
                    if handle.ready:
                        await self._send(handle, P.WEIGHTS, sent, td)

            def missing() -> list[int]:
                return [h.index for h in targets if self.acked_version(h) < version and not h.lost]

            def dead() -> list[int]:
                gone = [h.index for h in targets if h.process is not None and h.process.exitcode is not None]
                failed = getattr(self.events.failure, "worker_id", None)
                if isinstance(failed, int):
                    gone.append(failed)
                return sorted(set(gone))

            deadline = time.monotonic() + limit
            while missing():
                refusals = {h.index: self.refused(h) for h in targets}
                refused = {i: r[1] for i, r in refusals.items() if r is not None and r[0] == version}
                if refused and set(missing()) <= set(refused):  # every worker answered: no need to wait
                    why = "; ".join(f"worker {i}: {reason}" for i, reason in sorted(refused.items()))
                    raise WeightSyncError(
                        f"weights version {version} were refused by workers {sorted(refused)}, which keep "
                        f"collecting with their previous weights: {why}",
                        worker_ids=sorted(refused),
                    )
                # Without restarts (or once the pool is broken) a dead worker never answers: wait for the live ones.
                # Elastic: a dead one is restarted or lost within a liveness period or two; either ends its wait.
                restarting = (self.max_restarts or self.elastic) and self.events.failure is None
                waiting = missing() if restarting else [i for i in missing() if i not in dead()]
                remaining = deadline - time.monotonic()
                if not waiting or remaining <= 0:
                    why = f"; workers {dead()} are dead" if dead() else ""
                    raise WeightSyncError(
                        f"weights version {version} were not acknowledged by workers {missing()} within {limit}s{why}",
                        worker_ids=missing(),
                    ) from self.events.failure
                await self.events.wait(min(remaining, MONITOR_PERIOD))
            return version
