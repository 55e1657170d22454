"""Env groups for central inference: a worker's envs in several groups, each stepping while the others wait.

With its policy on an inference server, a worker would otherwise wait for the round trip at every step, its
core idle. :class:`EngineGroups` drives several :class:`~acollect._rollout.blocking.RolloutEngine` (each over a share of
the worker's envs, built from the same factory, each with its own connection to the server) in turn, with their
policy calls split (:meth:`~acollect._rollout.blocking.RolloutEngine.split_policy_calls`): group A sends its
observations, group B
receives its actions and steps, sends; group C ..., group A receives and steps, ... So the server's passes for
some groups run while the worker steps the others, and a pass takes the requests of every group that waits.

To the worker it is one engine: one ``[n_envs, T]`` batch (group A's rows, then group B's, ...: the envs in the
order of a single env of ``n_envs``), the same layout, counters and interruptions (a pause keeps the steps
taken by every group and continues them).
"""

from __future__ import annotations

import itertools
import select
import threading
from collections.abc import Generator, Sequence

import torch
from tensordict import TensorDict

from acollect._rollout.blocking import RolloutEngine, exploration
from acollect._time_split import ACTIONS
from acollect.envs import EnvBase

__all__ = ["EngineGroups"]

_POLL_MS = 50  # how often a worker waiting for any group's actions looks at its interrupt


class EngineGroups:
    """Several engines over shares of a worker's envs, stepped in turn, as one
    :class:`~acollect._rollout.engine.BlockingEngine`.

    Args:
        engines: the engines, in the order of their rows in each batch (the first over rows ``[0, n_0)``, the
            next over the following ``n_1`` rows, ...); the same ``time_steps``; at least two; each with a policy
            whose calls split in two (:class:`~acollect._policy.SplitPolicy`, an inference server's client).

    Raises:
        ValueError: fewer than two engines, or engines that step unlike.
        ConfigurationError: a policy whose calls do not split.
    """

    def __init__(self, engines: Sequence[RolloutEngine]) -> None:
        if len(engines) < 2:
            raise ValueError(f"env groups need at least two engines, got {len(engines)}")
        steps = {engine.time_steps for engine in engines}
        if len(steps) != 1:
            raise ValueError(f"the groups step {sorted(steps)} times per batch: they must step alike")
        self.engines = tuple(engines)
        # Each group's policy calls split in two, so the worker steps the others while a group's pass runs.
        self._policies = [engine.split_policy_calls() for engine in self.engines]
        first = self.engines[0]
        self.policy = first.policy
        self.n_envs = sum(engine.n_envs for engine in self.engines)
        self.time_steps = first.time_steps
        self.frames_per_batch = self.n_envs * self.time_steps
        self.exploration_type = first.spec.exploration_type
        #: frames collected in completed batches
        self.frames = 0
        self._discarded = 0
        # The batch in progress (a pause stopped it) and which groups have finished their part of it.
        self._current: TensorDict | None = None
        self._finished = [False] * len(self.engines)
        # Where each group's rows start in a batch.
        self._starts = [0, *itertools.accumulate(engine.n_envs for engine in self.engines)]
        # When each group last asked for its actions (a turn count): the longest waiting goes first.
        self._asked = [0] * len(self.engines)
        self._turns = 0
        self._poller = select.poll()
        #: where the worker's time goes: one stopwatch for every group, as they step in one thread
        self.stopwatch = first.stopwatch
        for engine in self.engines:
            engine.stopwatch = self.stopwatch

    # -- the BlockingEngine protocol ------------------------------------------------------
    @property
    def steps(self) -> int:
        """Env steps taken by every group (heartbeats carry it)."""
        return sum(engine.steps for engine in self.engines)

    @property
    def discarded_frames(self) -> int:
        """Frames stepped and then given up (a reseed or a restore during a batch)."""
        return self._discarded + sum(engine.discarded_frames for engine in self.engines)

    @property
    def env_restarts(self) -> int:
        """Envs rebuilt after an exception, in every group (each group's env is rebuilt alone)."""
        return sum(engine.env_restarts for engine in self.engines)

    @property
    def env_restarts_by_sub_env(self) -> dict[int, int]:
        """Sub-envs rebuilt alone, by their index in the worker (the groups' envs, in order, one after the other)."""
        found, offset = {}, 0
        for engine in self.engines:
            found.update({offset + i: n for i, n in engine.env_restarts_by_sub_env.items()})
            offset += engine.n_envs
        return found

    @property
    def env(self) -> EnvBase:
        """The first group's env (a rebuilt one once it raised, with ``env_errors="restart"``)."""
        return self.engines[0].env

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
        """Trajectory ids handed out by the busiest group (groups never share an id: their offsets differ)."""
        return max(engine.next_traj_counter for engine in self.engines)

    @next_traj_counter.setter
    def next_traj_counter(self, value: int) -> None:
        for engine in self.engines:
            engine.next_traj_counter = value

    def seed(self, seed: int) -> None:
        """Seeds the groups as one env of ``n_envs`` would be (each group from ``seed + its first row``)."""
        for engine, start in zip(self.engines, self._starts, strict=False):
            engine.seed(seed + start)
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
        self._current, self._finished = None, [False] * len(self.engines)

    def allocate(self) -> TensorDict:
        """Empty buffers with the layout of one batch: the groups' rows one after the other."""
        batch = TensorDict.cat([engine.allocate() for engine in self.engines], 0)
        batch.names = [None, "time"]
        return batch

    def collect(self, stop: threading.Event | None = None, *, out: TensorDict | None = None) -> TensorDict:
        """Collects one batch (blocking), the groups stepping in turn, or finishes one an interruption left.

        Raises:
            RolloutInterrupted: ``stop`` was set; the steps every group took are kept for the next call.
        """
        if self._current is not None and out is not None and out is not self._current:
            out.copy_(self._current)
        elif out is None:
            out = self._current if self._current is not None else self.allocate()
        self._current = out
        parts = [out[start:stop_] for start, stop_ in itertools.pairwise(self._starts)]
        live: dict[int, Generator[None, None, TensorDict]] = {}
        with torch.inference_mode(), exploration(self.exploration_type):
            try:
                for i, engine in enumerate(self.engines):
                    if not self._finished[i]:
                        live[i] = engine.stepper(stop, out=parts[i])
                        self._advance(live, i)
                while live:
                    self._advance(live, self._next(live, stop))
            finally:
                for steps in live.values():
                    steps.close()  # a group waiting for its actions keeps its steps (its late answer is dropped)
        self._current, self._finished = None, [False] * len(self.engines)
        self.frames += self.frames_per_batch
        out.names = [None, "time"]
        return out

    def _next(self, live: dict[int, Generator[None, None, TensorDict]], stop: threading.Event | None) -> int:
        """The group to step next: the first, in the order they asked, whose answer came; passes may end in any
        order (several run at once), and stepping the group whose actions are here keeps the worker busy."""
        order = sorted(live, key=self._asked.__getitem__)
        fds = {}
        for i in order:
            fd = self._policies[i].answer_fileno()
            if fd is None:
                return order[0]  # answers as messages: taken in the order asked
            fds[fd] = i
        poller = self._poller
        for fd in fds:
            poller.register(fd, select.POLLIN)
        self.stopwatch.switch(ACTIONS)  # every group waits for its actions: nothing to step meanwhile
        try:
            while True:
                ready = {fd for fd, _ in poller.poll(_POLL_MS)}
                if ready:
                    return next(i for i in order if self._fd_of(i, fds) in ready)
                if stop is not None and stop.is_set():
                    return order[0]  # its wait sees the interruption
        finally:
            for fd in fds:
                poller.unregister(fd)

    @staticmethod
    def _fd_of(i: int, fds: dict[int, int]) -> int:
        return next(fd for fd, group in fds.items() if group == i)

    def _advance(self, live: dict[int, Generator[None, None, TensorDict]], i: int) -> None:
        self._turns += 1
        self._asked[i] = self._turns  # it asks again at the end of this step: last in line
        try:
            next(live[i])
        except StopIteration:
            del live[i]
            self._finished[i] = True
        except BaseException:
            del live[i]  # finished (interrupted, or failed): nothing to close
            raise

    def close(self) -> None:
        """Closes every group's envs and connections (each, even if closing another raised)."""
        first: BaseException | None = None
        for engine in self.engines:
            try:
                engine.close()
            except Exception as exc:  # noqa: PERF203 - every group is closed, whatever the others raise
                first = first or exc
        if first is not None:
            raise first
