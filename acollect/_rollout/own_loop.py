"""Coroutine envs driven from blocking code: :class:`LoopRollout`, one batch at a time on a loop of its own.

A worker process (``MultiSyncCollector`` and the other worker collectors) runs plain blocking code
around a :class:`~acollect._rollout.engine.BlockingEngine`. Given an :class:`~acollect.envs.AsyncEnvPool`,
it runs a :class:`LoopRollout`: that surface (``collect(stop, out=)``, ``allocate()``, the counters,
``seed``/``restart``) over an :class:`~acollect._rollout.coroutines.AsyncRollout` on an event loop the
engine owns. Each ``collect`` runs that loop until the batch is complete, so the
worker's envs follow the same batching rule as in the in-process ``Collector``; between batches the
loop stands still (and so do the envs). Setting ``stop`` ends ``collect`` with
:class:`~acollect._rollout.blocking.RolloutInterrupted` within a few milliseconds, losing nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar, overload

import anyio
from tensordict import TensorDict

from acollect._policy import PolicyAdapter
from acollect._rollout.blocking import RolloutInterrupted
from acollect._rollout.coroutines import AsyncRollout
from acollect._runtime.tasks import TaskOwner
from acollect._time_split import Stopwatch
from acollect.envs import AsyncEnvPool

__all__ = ["LoopRollout"]

#: how often a running ``collect`` looks at its stop event
_STOP_POLL_SECONDS = 0.005

_T = TypeVar("_T")


class _OfRollout(Generic[_T]):
    """An attribute of a :class:`LoopRollout` that is its wrapped :class:`AsyncRollout`'s, read and set there."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, engine: None, owner: type) -> _OfRollout[_T]: ...
    @overload
    def __get__(self, engine: LoopRollout, owner: type) -> _T: ...
    def __get__(self, engine: LoopRollout | None, owner: type) -> _T | _OfRollout[_T]:
        # On the class (help(), inspect): the descriptor itself, as a property would be.
        return self if engine is None else getattr(engine.rollout, self.name)

    def __set__(self, engine: LoopRollout, value: _T) -> None:
        setattr(engine.rollout, self.name, value)


class LoopRollout:
    """An :class:`AsyncRollout` driven from blocking code: a :class:`~acollect._rollout.engine.BlockingEngine`.

    Examples:
        >>> from acollect._devices import resolve_devices
        >>> from acollect._policy import RandomPolicy
        >>> from acollect.testing import AsyncCountingEnv
        >>> pool = AsyncEnvPool(AsyncCountingEnv, num_envs=2)
        >>> engine = LoopRollout(AsyncRollout(pool, RandomPolicy(pool.action_spec, (2,)), time_steps=4,
        ...                                   devices=resolve_devices()))
        >>> engine.collect()["next", "observation"][1, :, 0].tolist()
        [1.0, 2.0, 3.0, 4.0]
        >>> engine.close()
    """

    def __init__(self, rollout: AsyncRollout) -> None:
        self.rollout = rollout
        # Coroutine envs step as tasks on this loop, their policy passes batched among them: a batch's time is
        # not split between env and policy here (it counts as "other"); the waits for the trainer are.
        self.stopwatch = Stopwatch()
        self._loop = asyncio.new_event_loop()
        self._tasks: TaskOwner | None = None
        self._failure: BaseException | None = None

    # -- the BlockingEngine protocol: the wrapped rollout's, but for in_batch -----------------
    env = _OfRollout[AsyncEnvPool]()
    policy = _OfRollout[PolicyAdapter]()
    n_envs = _OfRollout[int]()
    frames_per_batch = _OfRollout[int]()
    steps = _OfRollout[int]()
    discarded_frames = _OfRollout[int]()
    env_restarts = _OfRollout[int]()
    env_restarts_by_sub_env = _OfRollout[dict[int, int]]()
    frames = _OfRollout[int]()
    policy_version = _OfRollout[int]()
    next_traj_counter = _OfRollout[int]()
    seed = _OfRollout[Callable[[int], None]]()
    restart = _OfRollout[Callable[[], None]]()

    @property
    def in_batch(self) -> bool:
        """Never: the loop stands still between calls, and weights may be applied then."""
        return False

    # -- running the loop -------------------------------------------------------------------
    def _failed(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc

    async def _start(self) -> TaskOwner:
        if self._tasks is None:
            self._tasks = TaskOwner("worker-async-envs", on_failure=self._failed)
            self._tasks.ensure_group()
            await self._tasks.started()
        await self.rollout.ensure_running(self._tasks.spawn)
        return self._tasks

    def allocate(self) -> TensorDict:
        """Empty buffers with the layout of one batch (resets the envs and probes the policy first)."""
        self._loop.run_until_complete(self._start())
        return self.rollout.empty_batch()

    def collect(self, stop: threading.Event | None = None, *, out: TensorDict | None = None) -> TensorDict:
        """Runs the loop until a batch is complete; ``stop`` interrupts it (nothing is lost)."""
        batch = self._loop.run_until_complete(self._collect(stop))
        if out is None:
            return batch
        out.copy_(batch)
        out.names = [None, "time"]
        return out

    async def _collect(self, stop: threading.Event | None) -> TensorDict:
        tasks = await self._start()
        taken: list[TensorDict] = []
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                taken.append(await self.rollout.collect(tasks.spawn))
                tg.cancel_scope.cancel()

            async def watch() -> None:
                # ``stop`` is a threading.Event set by another thread: nothing on this loop wakes for it.
                while True:
                    if self._failure is not None or (stop is not None and stop.is_set()):
                        break
                    await anyio.sleep(_STOP_POLL_SECONDS)
                tg.cancel_scope.cancel()

            tg.start_soon(take)
            tg.start_soon(watch)
        if taken:
            return taken[0]
        if self._failure is not None:
            raise self._failure
        raise RolloutInterrupted

    def close(self) -> None:
        """Stops the env tasks, awaits every env's ``aclose()``, closes the policy and the loop; idempotent."""
        if self._loop.is_closed():
            return

        async def close_all() -> None:
            await self.rollout.aclose()
            if self._tasks is not None:
                await self._tasks.aclose(5.0)

        try:
            self._loop.run_until_complete(close_all())
        finally:
            self._loop.close()
