"""AsyncEnvPool: many coroutine envs as one acollect env.

The in-process :class:`~acollect.Collector` and every worker process recognise an
:class:`AsyncEnvPool` and step it on an event loop, each env as its own task (see
:mod:`acollect._rollout.coroutines`): no thread, no process per env. Called from plain code
(:meth:`~acollect.envs.EnvBase.reset`, :meth:`~acollect.envs.EnvBase.step`), the pool is an
ordinary blocking acollect env that runs its envs on a private event loop of its own, all of them
concurrently within each step (``asyncio.gather`` lockstep).

The pool also owns the envs' calls: :meth:`AsyncEnvPool.call_step` and
:meth:`AsyncEnvPool.call_reset` apply ``step_timeout`` and turn whatever an
env raises into an :class:`~acollect.errors.EnvError` naming its index,
chained to the env's own exception.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from acollect._runtime.loops import current_backend
from acollect._validate import check_int, check_seconds
from acollect.envs._async_env import AsyncEnv, StepChecker, check_async_env
from acollect.envs._base import DONE_KEYS, EnvBase
from acollect.envs._gym_spaces import observation_layout, space_to_spec
from acollect.errors import ConfigurationError, EnvError
from acollect.specs import TensorSpec

__all__ = ["AsyncEnvPool"]

logger = logging.getLogger(__name__)

#: seconds each env's ``aclose()`` may take at shutdown
ACLOSE_TIMEOUT = 5.0


class AsyncEnvPool(EnvBase):
    """``num_envs`` coroutine envs (:class:`~acollect.envs.AsyncEnv`) stepped as one acollect env.

    A pool that cannot be built (``make_env`` raising, or a wrong env) closes the envs it built
    (``aclose()``) before it raises.

    Args:
        make_env: a zero-argument callable (usually the env class) building one :class:`AsyncEnv`;
            it is called ``num_envs`` times, here, so keep constructors cheap and open connections in
            the first ``reset``.
        num_envs: how many envs run concurrently.

    Keyword Args:
        step_timeout (float | None): seconds each ``step`` (and ``reset``) may take; a longer one is an
            :class:`~acollect.errors.EnvError` naming the env. ``None``: no limit.
        categorical_action_encoding (bool): ``Discrete`` actions as an index (default) or one-hot.

    Raises:
        ConfigurationError: ``make_env`` does not build an ``AsyncEnv`` whose ``reset``/``step`` are
            coroutines, the envs' spaces differ, or an argument is out of range.
        EnvError: ``make_env`` raised; the message names the index of the env it was building, and
            the original exception is the ``__cause__``.

    Examples:
        >>> import torch
        >>> from acollect.testing import AsyncCountingEnv
        >>> pool = AsyncEnvPool(AsyncCountingEnv, num_envs=3)
        >>> root = pool.reset()  # blocking use: a private event loop steps the envs together
        >>> pool.step(root.set("action", torch.zeros(3, dtype=torch.int64)))["observation"].squeeze(-1).tolist()
        [1.0, 1.0, 1.0]
        >>> pool.close()
    """

    action_spec: TensorSpec  # one action: these envs have no keys of their own
    reward_spec: TensorSpec

    def __init__(
        self,
        make_env: Callable[[], AsyncEnv],
        num_envs: int,
        *,
        step_timeout: float | None = None,
        categorical_action_encoding: bool = True,
    ) -> None:
        if not callable(make_env):
            raise ConfigurationError.bad_value("make_env", make_env, "a zero-argument callable building an AsyncEnv")
        n = check_int("num_envs", num_envs, minimum=1)
        check_seconds("step_timeout", step_timeout, optional=True)
        self.step_timeout = None if step_timeout is None else float(step_timeout)
        made_by = f"make_env={getattr(make_env, '__qualname__', make_env)!r}"
        self._make_env, self._made_by = make_env, made_by
        self.envs: list[AsyncEnv] = []
        try:
            for i in range(n):
                try:
                    made = make_env()
                except Exception as exc:
                    raise EnvError(f"env {i}: {made_by} raised {type(exc).__name__}: {exc}") from exc
                self.envs.append(check_async_env(made, made_by))
            first = self.envs[0]
            for i, env in enumerate(self.envs[1:], 1):
                if env.observation_space != first.observation_space or env.action_space != first.action_space:
                    raise ConfigurationError(
                        f"env {i} has spaces {env.observation_space} / {env.action_space} where env 0 has "
                        f"{first.observation_space} / {first.action_space}: every env of a pool must share them"
                    )
            self.batch_size = torch.Size([n])
            self.observation_spec, self.leaves = observation_layout(first.observation_space, self.device)
            self.action_spec = space_to_spec(first.action_space, categorical=categorical_action_encoding)
            #: Discrete actions reach the envs as Python ints (JSON-friendly); the others as numpy arrays
            self.int_actions = isinstance(first.action_space, spaces.Discrete) and categorical_action_encoding
            leaf_specs = [self.observation_spec[leaf.key] for leaf in self.leaves]
            self.checker = StepChecker(
                self.leaves,
                [tuple(spec.shape) for spec in leaf_specs],
                [torch.empty(0, dtype=spec.dtype).numpy().dtype for spec in leaf_specs],
                [type(env).__name__ for env in self.envs],
            )
        except BaseException:  # a pool that was never made cannot be closed later: close what it built now
            self._closed_unbuilt()  # and leave nothing for close() (or the finaliser) to do
            close_built(self.envs)
            raise
        self._loop: asyncio.AbstractEventLoop | None = None
        # The envs whose aclose() is still to be awaited: all of them until aclose_envs(), then none.
        self._unclosed: list[Any] = list(self.envs)

    # -- the envs' calls: deadlines and errors -------------------------------------------
    async def call_step(self, i: int, action: Any) -> Any:
        """Awaits env ``i``'s ``step(action)`` under ``step_timeout``; errors become :class:`EnvError`."""
        env = self.envs[i]
        try:
            if self.step_timeout is None:
                return await env.step(action)
            with anyio.move_on_after(self.step_timeout) as scope:
                return await env.step(action)
        except Exception as exc:
            raise EnvError(f"env {i} ({type(env).__name__}).step raised {type(exc).__name__}: {exc}") from exc
        assert scope.cancelled_caught
        raise EnvError(f"env {i} ({type(env).__name__}).step took longer than step_timeout={self.step_timeout}s")

    async def call_reset(self, i: int, seed: int | None = None) -> Any:
        """Awaits env ``i``'s ``reset(seed=seed)``; returns the checked observation."""
        env = self.envs[i]
        try:
            with anyio.move_on_after(self.step_timeout if self.step_timeout is not None else float("inf")) as scope:
                return self.checker.split_reset(i, await env.reset(seed=seed))
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"env {i} ({type(env).__name__}).reset raised {type(exc).__name__}: {exc}") from exc
        assert scope.cancelled_caught
        raise EnvError(f"env {i} ({type(env).__name__}).reset took longer than step_timeout={self.step_timeout}s")

    async def rebuild(self, i: int) -> None:
        """Replaces env ``i`` with a new one from ``make_env`` (``env_errors="restart"``: it raised); it is then reset
        like a fresh env. The old one's ``aclose()`` is awaited first, under :data:`ACLOSE_TIMEOUT`.

        Raises:
            EnvError: ``make_env`` raised (the original exception is the ``__cause__``).
            ConfigurationError: it built no ``AsyncEnv``, or one with other spaces than the pool's.
        """
        await aclose_each([self.envs[i]], ACLOSE_TIMEOUT)
        try:
            made = self._make_env()
        except Exception as exc:
            raise EnvError(f"env {i}: {self._made_by} raised {type(exc).__name__}: {exc}") from exc
        env = check_async_env(made, self._made_by)
        other = self.envs[1 if i == 0 and len(self.envs) > 1 else 0]
        if other is not self.envs[i] and (
            env.observation_space != other.observation_space or env.action_space != other.action_space
        ):
            await aclose_each([env], ACLOSE_TIMEOUT)
            raise ConfigurationError(
                f"the rebuilt env {i} has spaces {env.observation_space} / {env.action_space} where the pool's envs "
                f"have {other.observation_space} / {other.action_space}"
            )
        self.envs[i] = env

    def action_for(self, i: int, actions: np.ndarray) -> Any:
        """Env ``i``'s action out of a ``[n, ...]`` array, as the env receives it."""
        return int(actions[i]) if self.int_actions else actions[i].copy()

    async def aclose_envs(self, timeout: float | None = None) -> None:
        """Awaits every env's ``aclose()`` concurrently, each under ``timeout`` (:data:`ACLOSE_TIMEOUT`); once.

        Shielded: a cancelled caller still closes every env.
        """
        envs, self._unclosed = self._unclosed, []
        if envs:
            await aclose_each(envs, ACLOSE_TIMEOUT if timeout is None else timeout)

    # -- the blocking EnvBase API: lockstep on a private loop ------------------------------------
    def _run(self, coro_fn: Callable[[], Any]) -> Any:
        if current_backend() is not None:
            raise EnvError(
                "AsyncEnvPool's blocking methods were called on a running event loop: the in-process Collector "
                "steps a pool on its loop by itself; elsewhere call them from plain (non-async) code"
            )
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro_fn())

    def _views(self, td: TensorDictBase) -> list[np.ndarray]:
        return [td.get(leaf.key).numpy() for leaf in self.leaves]

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        rows = range(self.num_envs) if mask is None else np.flatnonzero(mask.reshape(-1).cpu().numpy()).tolist()
        views = self._views(out)

        async def reset_all() -> list[Any]:
            return await asyncio.gather(*(self.call_reset(i, None if seed is None else seed + i) for i in rows))

        for i, obs in zip(rows, self._run(reset_all), strict=True):
            self.checker.write_obs(i, "reset", obs, views, i)
            for key in DONE_KEYS:
                out.get(key)[i] = False

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._check_open()
        actions = action.detach().cpu().numpy()
        next_views, root_views = self._views(next_out), self._views(root_out)
        reward = next_out.get("reward").numpy().reshape(-1)
        flags = {key: next_out.get(key).numpy().reshape(-1) for key in DONE_KEYS}
        checker = self.checker

        async def step_one(i: int) -> None:
            obs, reward[i], term, trunc = checker.split_step(i, await self.call_step(i, self.action_for(i, actions)))
            checker.write_obs(i, "step", obs, next_views, i)
            flags["terminated"][i], flags["truncated"][i], flags["done"][i] = term, trunc, term or trunc
            if term or trunc:
                obs = await self.call_reset(i)
            checker.write_obs(i, "step", obs, root_views, i)

        async def step_all() -> None:
            await asyncio.gather(*(step_one(i) for i in range(self.num_envs)))

        self._run(step_all)
        for key in DONE_KEYS:
            root_out.get(key).zero_()

    def _close(self) -> None:
        # Never a loop inside a running one (asyncio or trio), even from the finalizer of a pool dropped unclosed:
        # anyio inside the nested loop would take the running loop's backend and corrupt that loop's state.
        running = current_backend() is not None
        loop, self._loop = self._loop, None
        if loop is not None:  # the private loop of the blocking API: its envs are closed on it, in a thread if need be
            try:
                if running:
                    _elsewhere(lambda: loop.run_until_complete(self.aclose_envs()))
                else:
                    loop.run_until_complete(self.aclose_envs())
            finally:
                loop.close()
        elif self._unclosed:
            if not running:  # never used, or used by a collector that did not close the envs: close them now
                asyncio.run(self.aclose_envs())
            else:
                logger.warning("AsyncEnvPool.close() on a running loop: await pool.aclose_envs() first")


async def aclose_each(envs: Sequence[AsyncEnv], timeout: float) -> None:
    """Awaits every env's ``aclose()`` concurrently, each under ``timeout`` seconds.

    Shielded: a cancelled caller still closes every env. An env whose ``aclose()`` raises or
    overruns is logged and the others are closed all the same.
    """

    async def close_one(i: int, env: AsyncEnv) -> None:
        with anyio.move_on_after(timeout) as scope:
            try:
                await env.aclose()
            except Exception as exc:  # one env's failed clean-up must not keep the others open
                logger.warning("env %d (%s).aclose() raised %s: %s", i, type(env).__name__, type(exc).__name__, exc)
        if scope.cancelled_caught:
            logger.warning("env %d (%s).aclose() took longer than %.1fs", i, type(env).__name__, timeout)

    with anyio.CancelScope(shield=True):
        async with anyio.create_task_group() as tg:
            for i, env in enumerate(envs):
                tg.start_soon(close_one, i, env)


def close_built(envs: Sequence[AsyncEnv]) -> None:
    """Closes the envs of a pool whose construction failed, from plain code, within :data:`ACLOSE_TIMEOUT`.

    The constructor is plain code but may be called on a running event loop, asyncio's or trio's (a pool
    built inside ``async def``), whose thread cannot run another loop: there the envs are closed on a
    loop of a short-lived thread of their own.
    """
    if not envs:
        return
    if current_backend() is None:
        asyncio.run(aclose_each(envs, ACLOSE_TIMEOUT))
        return
    _elsewhere(lambda: asyncio.run(aclose_each(envs, ACLOSE_TIMEOUT)))


def _elsewhere(close: Callable[[], Any]) -> None:
    """Runs ``close`` (a loop of its own) on a short-lived thread: this thread runs an event loop already."""
    closer = threading.Thread(target=close, name="acollect-pool-aclose", daemon=True)
    closer.start()
    # Each aclose() has its own deadline; the margin covers starting the loop and thread.
    closer.join(ACLOSE_TIMEOUT + 1.0)
