"""What a worker applies at a batch boundary: weights, seed and counters, staged until the engine is free.

The control thread receives them while the runner may be in the middle of a batch; the
runner applies what is staged before its next batch (:meth:`Staging.apply_pending`), or
the control thread applies it at once when the engine is idle. Every message that starts the envs
afresh (:data:`~acollect._workers.protocol.RESETS`) is counted, and each batch carries the count it
began after, so the collector can tell a batch that began before a reseed from one that began after
it. A batch a pause left half-way is finished before anything else applies, except a reseed or a
state restore, which give it up (its frames counted in the heartbeat's ``discarded``).

A weight push arrives as frames, as a shared-memory segment written once for every local worker, or
(``DistributedCollector``) as a torch.distributed broadcast; whichever way it came,
:func:`~acollect._weights.sync.read_weights` finds its buffers and :func:`plan_weights` checks
every model against this worker's own policy before anything is kept, so a push that does not fit
changes nothing: the worker refuses it and goes on collecting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect._batches.shm import ShmSegment
from acollect._rollout.engine import BlockingEngine, Engine
from acollect._weights.sync import Staged, WeightPlan, copy_planned, plan_unflatten, read_weights
from acollect._workers import protocol as P
from acollect._workers.worker_engine import resolve_model
from acollect.errors import ProtocolError

__all__ = ["Staging", "plan_weights"]


def plan_weights(engine: Engine | None, weights: Staged) -> list[WeightPlan]:
    """Checks every model before any is copied, so a bad push changes nothing."""
    if engine is None:
        raise ProtocolError("this worker has no policy to load weights into")
    targets = {model_id: TensorDict.from_module(resolve_model(engine, model_id)) for model_id in weights}
    return [plan_unflatten(layout, flat, targets[model_id]) for model_id, (layout, flat) in weights.items()]


class Staging:
    """Staged weights, seed and state of a worker, and the lock of its engine: one of the worker's parts.

    The control thread stages (:meth:`stage_weights`, :meth:`stage_seed`, :meth:`stage_state`), the runner applies
    at each batch boundary (:meth:`apply_pending`, with :attr:`engine_lock` held); nobody else writes its fields.

    Args:
        send: sends a message to the collector (the worker's control socket).
        engine: the worker's engine (``None`` until built).
        dist: the worker's torch.distributed link (``None`` unless ``DistributedCollector`` set one up).
        next_request: the number of the one-shot request the next batch serves (the first asked and not served,
            else the one after the last asked).
        requests_waiting: whether a one-shot request waits to be served.
        asked: the highest number of a one-shot request received.
    """

    def __init__(
        self,
        *,
        send: Callable[..., None],
        engine: Callable[[], BlockingEngine | None],
        dist: Callable[[], Any],
        next_request: Callable[[], int],
        requests_waiting: Callable[[], bool],
        asked: Callable[[], int],
    ) -> None:
        self._send, self._engine, self._dist = send, engine, dist
        self._next_request, self._requests_waiting, self._asked = next_request, requests_waiting, asked
        #: held by whoever uses the engine (the runner for a whole batch)
        self.engine_lock = threading.Lock()
        # Staged work waits in these fields, guarded by `_lock`, for the next batch boundary.
        self._lock = threading.Lock()
        # Pushes waiting for their first batch, in the order they came: (the first one-shot request they apply to,
        # version, a private copy of each model's weights). Several may wait: each chooses the batches from its own
        # first one on, so none is skipped where the batch it begins with was asked of another worker already.
        self._weights: list[tuple[int, int, dict[str, tuple[Any, torch.Tensor]]]] = []
        self._seed: int | None = None
        self._state: dict[str, int] | None = None
        self._resets = 0  # P.RESETS messages received
        #: the shared-memory segments of weight pushes attached so far (one per model, rewritten by each push)
        self.segments: dict[str, ShmSegment] = {}

    def stage_seed(self, seed: int) -> None:
        """A reseed: applied at the next batch boundary (at once if the engine is idle)."""
        with self._lock:
            self._seed = seed
            self._resets += 1
        self.apply_if_idle()

    def stage_state(self, counters: dict[str, int]) -> None:
        """Restored counters (``next_traj_counter``, ``frames``): applied as a reseed is."""
        with self._lock:
            self._state = counters
            self._resets += 1
        self.apply_if_idle()

    def close(self) -> None:
        """Unmaps the weight segments attached."""
        for segment in self.segments.values():
            segment.close()

    # -- weights, seeds, state ---------------------------------------------------------
    def stage_weights(self, header: dict[str, Any], td: TensorDictBase | None) -> None:
        """A weight push: checked against the worker's policy, applied now if the engine is idle, else staged."""
        version = header.get("version")
        try:
            if type(version) is not int:
                raise ProtocolError(f"weights version {version!r:.40} is not an int")
            staged = read_weights(header, td, self.segments, self._dist())
            plans = plan_weights(self._engine(), staged)  # checked against our own policy before anything is kept
        except Exception as exc:
            # A push that does not fit (a peer that skipped the collector's check, or a malformed message)
            # is refused, and this worker goes on collecting with the weights it has.
            refused = version if type(version) is int else -1
            self._send(P.ACK, {"version": refused, "error": f"{type(exc).__name__}: {exc}"})
            return
        engine = self._engine()
        assert engine is not None
        # The first one-shot request these weights choose the frames of: as the collector numbered it, since a
        # lockstep batch asked of one worker ahead keeps the version it was asked under on every worker, even one
        # asked for it after this push (its parts must not differ by when each was asked or begun); else the
        # first request received after this push.
        first = header.get("from", self._asked() + 1)
        if type(first) is not int:
            first = self._asked() + 1
        if self.engine_lock.acquire(blocking=False):
            try:
                # Idle between batches, nothing asked for before these weights: apply straight from the message or
                # segment, no staging copy. Not into a batch held by a pause: one version chooses a batch's frames.
                idle = not engine.in_batch and not self._requests_waiting() and self._asked() + 1 >= first
                if idle:
                    self._apply_due(None)  # any push staged before this one comes first
                    for plan in plans:
                        copy_planned(plan)
                    engine.policy_version = version
            finally:
                self.engine_lock.release()
        else:
            idle = False
        if not idle:
            # The segment may be rewritten by the next push once we acknowledge: keep a private copy.
            copies = {k: (layout, flat.clone()) for k, (layout, flat) in staged.items()}
            with self._lock:
                self._weights.append((first, version, copies))
        self._send(P.ACK, {"version": version})

    def _apply_due(self, serving: int | None) -> None:
        """Applies, in order, the staged pushes due for one-shot request ``serving`` (``None``: all of them)."""
        engine = self._engine()
        assert engine is not None
        with self._lock:
            # ``first`` never decreases from one push to the next, so the pushes due are the oldest ones.
            due = [p for p in self._weights if serving is None or p[0] <= serving]
            del self._weights[: len(due)]
        weights: dict[str, tuple[Any, torch.Tensor]] = {}
        for *_, models in due:
            weights.update(models)  # a later push of the same model supersedes an earlier one
        if due:
            for plan in plan_weights(engine, weights):
                copy_planned(plan)
            engine.policy_version = due[-1][1]

    def apply_pending(self, serving: int | None = None) -> int:
        """Applies staged seed, state and weights; returns ``resets`` as of them. Call with ``engine_lock``
        held, between batches.

        A seed or a state restore gives up a batch a pause left half-way (the engine counts its frames);
        weights wait while such a batch is still to be finished, so that one version chose all its frames, and
        while the batch about to begin (one-shot request number ``serving``; ``None``: a batch on credits) is
        numbered below the first they apply to.
        """
        engine = self._engine()
        assert engine is not None
        with self._lock:
            seed, self._seed = self._seed, None
            state, self._state = self._state, None
            resets = self._resets
        if seed is not None:
            torch.manual_seed(seed)
            engine.seed(seed)
        if state is not None:
            engine.next_traj_counter = state["next_traj_counter"]
            engine.frames = state["frames"]
            engine.restart()  # fresh trajectories get ids from the restored counter
        if not engine.in_batch:
            self._apply_due(serving)
        return resets

    def apply_if_idle(self) -> None:
        """Applies what is staged now, if the engine is built and no batch is using it."""
        if self._engine() is not None and self.engine_lock.acquire(blocking=False):
            try:
                self.apply_pending(self._next_request())
            finally:
                self.engine_lock.release()
