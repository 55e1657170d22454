"""Double buffering for central inference: a worker's envs in two groups, one stepping while the other waits.

With its policy on an inference server, a worker would otherwise wait for the round trip at every step, its
core idle. :class:`EnginePair` drives two :class:`~acollect.rollout.RolloutEngine` (each over half the
worker's envs, built from the same factory, each with its own connection to the server) in turn, with their
policy calls split (:attr:`~acollect.rollout.RolloutEngine.pipelined`): group A sends its observations, group
B receives its actions and steps, sends; group A receives and steps, ... So the server's pass for one group
runs while the worker steps the other.

To the worker it is one engine: one ``[n_envs, T]`` batch (group A's rows, then group B's: the envs in the
order of a single env of ``n_envs``), the same layout, counters and interruptions (a pause keeps the steps
taken by both groups and continues them).
"""

from __future__ import annotations

import threading
from collections.abc import Generator

import torch
from tensordict import TensorDict

from acollect.rollout import RolloutEngine, exploration

__all__ = ["EnginePair"]


class EnginePair:
    """Two engines over halves of a worker's envs, stepped in turn; the interface of one engine.

    Args:
        first: the engine over the first envs (rows ``[0, first.n_envs)`` of each batch).
        second: the engine over the others; same ``time_steps``.
    """

    def __init__(self, first: RolloutEngine, second: RolloutEngine) -> None:
        if first.time_steps != second.time_steps:
            raise ValueError(f"the two groups step {first.time_steps} and {second.time_steps} times per batch")
        self.engines = (first, second)
        for engine in self.engines:
            engine.pipelined = True
        self.policy = first.policy
        self.env = first.env
        self.n_envs = first.n_envs + second.n_envs
        self.time_steps = first.time_steps
        self.frames_per_batch = self.n_envs * self.time_steps
        self.exploration_type = first.exploration_type
        #: frames collected in completed batches
        self.frames = 0
        self._discarded = 0
        # The batch in progress (a pause stopped it) and which groups have finished their part of it.
        self._current: TensorDict | None = None
        self._finished = [False, False]

    # -- the engine's interface -----------------------------------------------------------
    @property
    def steps(self) -> int:
        """Env steps taken by both groups (heartbeats carry it)."""
        return sum(engine.steps for engine in self.engines)

    @property
    def discarded_frames(self) -> int:
        """Frames stepped and then given up (a reseed or a restore during a batch)."""
        return self._discarded + sum(engine.discarded_frames for engine in self.engines)

    @property
    def in_batch(self) -> bool:
        """Whether a batch was interrupted mid-way (the next :meth:`collect` continues it)."""
        return self._current is not None

    @property
    def policy_version(self) -> int:
        return self.engines[0].policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        for engine in self.engines:
            engine.policy_version = value

    @property
    def next_traj_counter(self) -> int:
        """Trajectory ids handed out by the busier group (the two never share an id: their offsets differ)."""
        return max(engine.next_traj_counter for engine in self.engines)

    @next_traj_counter.setter
    def next_traj_counter(self, value: int) -> None:
        for engine in self.engines:
            engine.next_traj_counter = value

    def seed(self, seed: int) -> None:
        """Seeds both groups as one env of ``n_envs`` would be (the second group from ``seed + its offset``)."""
        first, second = self.engines
        first.seed(seed)
        second.seed(seed + first.n_envs)
        self._give_up()

    def restart(self) -> None:
        """Starts the next batch from a fresh reset, giving up a batch interrupted mid-way (counted)."""
        for engine in self.engines:
            engine.restart()
        self._give_up()

    def _give_up(self) -> None:
        for engine, finished in zip(self.engines, self._finished, strict=True):
            if finished:
                self._discarded += engine.frames_per_batch
        self._current, self._finished = None, [False, False]

    def allocate(self) -> TensorDict:
        """Empty buffers with the layout of one batch: the two groups' rows one after the other."""
        batch: TensorDict = torch.cat([engine.allocate() for engine in self.engines], dim=0)  # type: ignore[assignment]
        batch.names = [None, "time"]
        return batch

    def collect(self, stop: threading.Event | None = None, *, out: TensorDict | None = None) -> TensorDict:
        """Collects one batch (blocking), both groups stepping in turn, or finishes one an interruption left.

        Raises:
            RolloutInterrupted: ``stop`` was set; the steps both groups took are kept for the next call.
        """
        if self._current is not None and out is not None and out is not self._current:
            out.copy_(self._current)
        elif out is None:
            out = self._current if self._current is not None else self.allocate()
        self._current = out
        split = self.engines[0].n_envs
        parts = (out[:split], out[split:])
        live: dict[int, Generator[None, None, TensorDict]] = {}
        with torch.inference_mode(), exploration(self.exploration_type):
            try:
                for i, engine in enumerate(self.engines):
                    if not self._finished[i]:
                        live[i] = engine.stepper(stop, out=parts[i])
                        self._advance(live, i)
                while live:
                    for i in list(live):
                        self._advance(live, i)
            finally:
                for steps in live.values():
                    steps.close()  # a group waiting for its actions keeps its steps (its late answer is dropped)
        self._current, self._finished = None, [False, False]
        self.frames += self.frames_per_batch
        out.names = [None, "time"]
        return out

    def _advance(self, live: dict[int, Generator[None, None, TensorDict]], i: int) -> None:
        try:
            next(live[i])
        except StopIteration:
            del live[i]
            self._finished[i] = True
        except BaseException:
            del live[i]  # finished (interrupted, or failed): nothing to close
            raise

    def close(self) -> None:
        """Closes both groups' envs and connections."""
        try:
            self.engines[0].close()
        finally:
            self.engines[1].close()
