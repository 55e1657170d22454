"""What the collectors and the worker processes use of a rollout engine: the :class:`Engine` protocol.

Four classes drive envs with a policy, and share no base class, each being a different machine:

* :class:`~acollect._rollout.blocking.RolloutEngine`: a batched env stepped by blocking code, into preallocated buffers;
* :class:`~acollect._rollout.coroutines.AsyncRollout`: coroutine envs, each a task on the caller's event loop;
* :class:`~acollect._rollout.own_loop.LoopRollout`: an ``AsyncRollout`` driven from blocking code, on a loop of its own;
* :class:`~acollect._rollout.groups.EngineGroups`: several ``RolloutEngine`` stepped in turn, under central inference.

What their users need of them is said here once. :class:`Engine` is what every user reads and sets between
batches: the counters (a worker's heartbeats and replies), trajectory ids and frames (state dicts), the weights'
version and the policy (weight pushes), seeding and restarting. :class:`BlockingEngine` adds how blocking code
drives one (``allocate``, ``collect(stop, out=)``, ``close``): every engine a worker process runs is one, and so
is the engine the in-process :class:`~acollect.Collector` runs in a thread. The in-process collector steps an
``AsyncRollout`` on its event loop through that class's own coroutines instead.

mypy checks each class against these protocols where it is built (:func:`acollect._rollout.build.build_engine`)
and where it is used; nothing is cast.

Examples:
    >>> from acollect._devices import resolve_devices
    >>> from acollect._policy import RandomPolicy
    >>> from acollect._rollout.blocking import RolloutEngine
    >>> from acollect.testing import CountingEnv
    >>> env = CountingEnv(num_envs=2)
    >>> engine = RolloutEngine(env, RandomPolicy(env.action_spec, (2,)), time_steps=2, devices=resolve_devices())
    >>> isinstance(engine, BlockingEngine), engine.collect().batch_size, engine.frames
    (True, torch.Size([2, 2]), 4)
    >>> engine.close()
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from tensordict import TensorDict

from acollect._policy import PolicyAdapter
from acollect._time_split import Stopwatch
from acollect.envs import EnvBase

__all__ = ["BlockingEngine", "Engine"]


@runtime_checkable
class Engine(Protocol):
    """What every user of a rollout engine reads and sets between batches.

    Attributes:
        frames: frames collected in the batches handed out (a resumed collector sets it).
        policy_version: the version of the weights the next frames are collected with (a weight push sets it).
        next_traj_counter: how many trajectory ids were handed out (a resumed collector sets it).
    """

    frames: int
    policy_version: int
    next_traj_counter: int

    @property
    def env(self) -> EnvBase:
        """The env the engine steps (it belongs to the engine); a weight push may target its modules."""
        ...

    @property
    def policy(self) -> PolicyAdapter:
        """The policy adapter (it belongs to the engine); weight pushes load its ``weights_module``."""
        ...

    @property
    def n_envs(self) -> int:
        """The envs stepped side by side: the rows of a batch."""
        ...

    @property
    def frames_per_batch(self) -> int:
        """The frames of each batch: ``n_envs`` times the steps of a row."""
        ...

    @property
    def steps(self) -> int:
        """Env steps taken so far: a batched env's step counts once, and so does each coroutine env's.

        A worker's heartbeats carry it: when it stops growing while a batch is asked for, an env hangs.
        """
        ...

    @property
    def discarded_frames(self) -> int:
        """Frames stepped and then given up (a reseed or a state restore dropped a batch begun)."""
        ...

    @property
    def env_restarts(self) -> int:
        """Envs rebuilt after an exception of theirs (``env_errors="restart"``: :mod:`acollect._rollout.env_faults`)."""
        ...

    @property
    def env_restarts_by_sub_env(self) -> dict[int, int]:
        """Of :attr:`env_restarts`, those of one sub-env rebuilt alone, by the sub-env's index."""
        ...

    @property
    def in_batch(self) -> bool:
        """Whether the policy may not change now: a batch an interruption left half-way must end with the weights
        that began it (or, coroutine envs, a pass runs in a thread)."""
        ...

    def seed(self, seed: int) -> None:
        """Seeds the envs (env ``i`` with ``seed + i``) and the random actions; the next batch starts afresh."""
        ...

    def restart(self) -> None:
        """The next batch starts from a fresh reset of every env (a batch begun is given up, and counted)."""
        ...


@runtime_checkable
class BlockingEngine(Engine, Protocol):
    """An :class:`Engine` that blocking code drives: what a worker process (and a collector's thread) calls."""

    #: where the collecting thread's time goes (:mod:`acollect._time_split`); its driver charges the waits between
    #: batches (for the trainer), the engine what it does within one
    stopwatch: Stopwatch

    def allocate(self) -> TensorDict:
        """Empty buffers with the layout of one batch (what a worker announces, and its shared slots hold)."""
        ...

    def collect(self, stop: threading.Event | None = None, *, out: TensorDict | None = None) -> TensorDict:
        """Collects one batch, blocking, into ``out`` if given (the layout of :meth:`allocate`).

        Raises:
            RolloutInterrupted: ``stop`` was set; the steps taken are kept and the next call continues them.
        """
        ...

    def close(self) -> None:
        """Closes the env and the policy's connections; idempotent."""
        ...
