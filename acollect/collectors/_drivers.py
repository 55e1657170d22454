"""How the in-process collector drives its engine: a blocking engine in a thread, or coroutine envs on the loop.

:class:`~acollect.Collector` picks one driver when it builds its engine, and from then on asks the driver only:
:meth:`start` it, :meth:`collect` a batch, :meth:`set_paused`, :meth:`aclose` or :meth:`release_now`. The engine
itself is read through the :class:`~acollect._rollout.engine.Engine` protocol every engine shares, so the
collector never asks which engine it holds.

* :class:`ThreadDriver`: a :class:`~acollect._rollout.blocking.RolloutEngine` stepped in a thread, a batch per
  call, so that no step blocks the event loop (the thread offers the GIL to the loop between steps);
* :class:`LoopDriver`: an :class:`~acollect._rollout.coroutines.AsyncRollout`, whose env tasks and policy passes
  run on the collector's event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch
from tensordict import TensorDictBase

from acollect._devices import cuda_ready, order_after
from acollect._rollout.blocking import RolloutEngine
from acollect._rollout.coroutines import AsyncRollout, Spawn
from acollect._rollout.engine import Engine
from acollect._runtime.threads import GilHandover, run_in_thread
from acollect._time_split import OTHER, TRAINER
from acollect._weights.updates import PolicyWeights

__all__ = ["Driver", "LoopDriver", "ThreadDriver"]

_T = TypeVar("_T")


class Driver(Protocol):
    """What the in-process collector asks of the way its engine runs."""

    @property
    def engine(self) -> Engine:
        """The engine driven (it owns the env and the policy)."""
        ...

    async def start(self, spawn: Spawn) -> None:
        """Whatever must run before the first batch (coroutine envs: their reset, probe and tasks)."""
        ...

    async def collect(self, seed: int | None, after: Callable[[TensorDictBase], _T]) -> tuple[_T, list[float] | None]:
        """One batch, seeded first with ``seed`` where given, and ``after(batch)`` where the batch was made (off
        the event loop where it was made off it); with the seconds each part of the time took
        (:mod:`acollect._time_split`; ``None``: not split)."""
        ...

    async def set_paused(self, paused: bool) -> None:
        """Stops (``True``) or resumes the stepping between batches."""
        ...

    async def aclose(self) -> None:
        """Closes the engine (its env and policy)."""
        ...

    def release_now(self) -> None:
        """Closes the engine without waiting (the event loop ended); never raises."""
        ...


def _leaves_of(out: object) -> list[object]:
    """The tensors of the TensorDicts in ``out`` (one, or a tuple holding some)."""
    values = out if isinstance(out, tuple) else (out,)
    return [
        leaf
        for value in values
        if isinstance(value, TensorDictBase)
        for leaf in value.values(include_nested=True, leaves_only=True)
    ]


class ThreadDriver:
    """A blocking engine stepped in a thread, a batch per call (see the module's notes).

    Args:
        engine: the engine.
        weights: the weights staged for it, applied before each batch.
        busy: held while a batch is collected (a weight push applies at once only where it is free).
        handover_interval: the ``gil_handover_interval`` option.
    """

    def __init__(
        self, engine: RolloutEngine, weights: PolicyWeights, busy: threading.Lock, handover_interval: float | None
    ) -> None:
        self._engine = engine
        self._weights = weights
        self._busy = busy
        self._handover_interval = handover_interval

    @property
    def engine(self) -> RolloutEngine:
        return self._engine

    async def start(self, spawn: Spawn) -> None:
        """Nothing: the thread starts with each batch."""

    async def collect(self, seed: int | None, after: Callable[[TensorDictBase], _T]) -> tuple[_T, list[float] | None]:
        threads = torch.get_num_threads()
        out, spent, ready, made = await run_in_thread(
            lambda stop: self._in_thread(stop, threads, seed, after), name="rollout"
        )
        # Written on the rollout thread's streams: the caller's wait for them (a batch on a GPU storing device).
        order_after(ready, made)
        return out, spent

    def _in_thread(
        self, stop: threading.Event, torch_threads: int, seed: int | None, after: Callable[[TensorDictBase], _T]
    ) -> tuple[_T, list[float], tuple[tuple[torch.device, Any], ...], list[object]]:
        engine = self._engine
        watch = engine.stopwatch
        watch.switch(OTHER)  # since the last batch was handed out: the trainer's time
        # A fresh thread does not follow the caller's torch.set_num_threads(): its ops would start a pool of
        # OpenMP threads that spin on the other cores (a fifth more CPU per batch, or worse, with one thread asked).
        torch.set_num_threads(torch_threads)
        with self._busy:
            self._weights.apply_pending(engine)
            if seed is not None:
                torch.manual_seed(seed)
                engine.seed(seed)
            interval = self._handover_interval
            handover = GilHandover(interval) if interval is not None else None
            batch: TensorDictBase = engine.collect(stop, between_steps=handover)
            # Here, off the event loop and before postproc can change the layout.
            out = after(batch)
            made = _leaves_of(out) if torch.cuda.is_initialized() else []  # no CUDA in this process: none to order
            ready = cuda_ready(made)
        spent = watch.take()
        watch.switch(TRAINER)  # until the next batch is asked for
        return out, spent, ready, made

    async def set_paused(self, paused: bool) -> None:
        """Nothing: the thread stops by itself at the end of its batch."""

    async def aclose(self) -> None:
        engine = self._engine
        await run_in_thread(lambda _stop: engine.close(), name="close-env")

    def release_now(self) -> None:
        # Closing an env may wait (on its subprocesses): a thread of its own does it, and nobody waits for it.
        threading.Thread(target=self._engine.close, name="acollect-close-env", daemon=True).start()


class LoopDriver:
    """Coroutine envs stepped as tasks on the collector's event loop (see the module's notes).

    Args:
        engine: the engine.
        spawn: starts a task in the collector's task group.
    """

    def __init__(self, engine: AsyncRollout, spawn: Spawn) -> None:
        self._engine = engine
        self._spawn = spawn

    @property
    def engine(self) -> AsyncRollout:
        return self._engine

    async def start(self, spawn: Spawn) -> None:
        await self._engine.ensure_running(spawn)  # resets every env, probes the policy, starts the env tasks

    async def collect(self, seed: int | None, after: Callable[[TensorDictBase], _T]) -> tuple[_T, list[float] | None]:
        engine = self._engine
        if seed is not None:
            torch.manual_seed(seed)
            engine.seed(seed)
        batch: TensorDictBase = await engine.collect(self._spawn)
        # The env tasks and the policy passes interleave on the loop: their time is not split (docs/metrics.md).
        return after(batch), None

    async def set_paused(self, paused: bool) -> None:
        await self._engine.set_paused(paused)

    async def aclose(self) -> None:
        await self._engine.aclose()

    def release_now(self) -> None:
        """Nothing: coroutine envs can only be closed on their event loop, which is ending; they go with it."""
