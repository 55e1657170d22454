"""Env faults survived (``env_errors="restart"``): the env that raised is rebuilt, counted, and given up on after a few.

A rollout engine built with an :class:`EnvFaults` hands it every exception its env raises from ``step`` or
``reset``: :meth:`EnvFaults.recover` for a batched env (:class:`~acollect._rollout.blocking.RolloutEngine`, in this
process, a worker, or each env group of central inference), :meth:`EnvFaults.arecover` for one coroutine env
of an :class:`~acollect.envs.AsyncEnvPool` (:mod:`acollect._rollout.env_steps`). The policy lives here once, whichever
engine and process steps the env:

* where the env can rebuild one sub-env alone (:meth:`~acollect.envs.EnvBase.contain_faults`: a ``GymEnv`` of
  sync vectorisation, a ``PettingZooEnv``, a coroutine env of a pool), only the sub-env that raised is rebuilt
  (:meth:`EnvFaults.contain`), its episode ending truncated at its last good step while its neighbours step on;
* otherwise the env that raised is closed (as well as it still closes) and a new one is built from the factory the
  collector was given (for a vector env, the whole vector env: the factory builds it whole), then reset by the
  engine, which ends the episodes in flight as truncated at their last good step;
* each rebuild is counted (:attr:`EnvFaults.restarts`, reported in ``stats().env_restarts``) and logged as a
  warning on the ``"acollect"`` logger, with the exception that caused it;
* an env that keeps failing (its factory raises, or it raises again before it took one step) is given up on
  after :data:`MAX_REBUILDS_IN_A_ROW` rebuilds in a row: its last exception is raised as it is, and breaks the
  collector as any env error does.

Examples:
    >>> import torch
    >>> from acollect.testing import CountingEnv, CrashingEnv
    >>> faults = EnvFaults(lambda: CountingEnv(num_envs=2))
    >>> env = CrashingEnv(crash_at_step=1, num_envs=2)
    >>> root = env.reset()
    >>> try:
    ...     env.step(root.set("action", torch.zeros(2, dtype=torch.int64)))
    ... except RuntimeError as exc:
    ...     env = faults.recover(env, exc, steps=0, start=lambda new: None)
    >>> type(env).__name__, faults.restarts
    ('CountingEnv', 1)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from acollect.envs import EnvBase, make_env
from acollect.errors import ConfigurationError, EnvError

__all__ = ["ENV_ERRORS", "MAX_REBUILDS_IN_A_ROW", "EnvFaults", "check_env_errors", "env_faults_for"]

logger = logging.getLogger("acollect")

#: What ``env_errors`` takes: ``"raise"`` (an env's exception breaks the collector) or ``"restart"``.
ENV_ERRORS = ("raise", "restart")

#: Rebuilds in a row, with no successful step between them, after which the env's next exception is raised.
MAX_REBUILDS_IN_A_ROW = 3


def check_env_errors(create_env_fn: Any, value: str, *, name: str = "env_errors") -> None:
    """Raises unless ``value`` is one of :data:`ENV_ERRORS` and, for ``"restart"``, the env can be built again.

    An env given built (an instance, not a factory or a gymnasium id) cannot be rebuilt: ``"restart"`` needs
    something to build it from.

    Examples:
        >>> from acollect.testing import CountingEnv
        >>> check_env_errors(CountingEnv, "restart")
        >>> check_env_errors(CountingEnv(), "restart")
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: env_errors='restart' is invalid: expected 'raise' where the env is ...
    """
    if value not in ENV_ERRORS:
        raise ConfigurationError.bad_value(name, value, " or ".join(repr(v) for v in ENV_ERRORS))
    if value == "restart" and not _rebuildable(create_env_fn):
        raise ConfigurationError.bad_value(
            name,
            value,
            "'raise' where the env is given built (an instance): 'restart' rebuilds the env, so it "
            "needs an env factory (a callable) or a gymnasium id",
        )


def _rebuildable(create_env_fn: Any) -> bool:
    # A class (CountingEnv) or a function builds anew; an env instance is callable only by accident.
    if isinstance(create_env_fn, str):
        return True
    return callable(create_env_fn) and (isinstance(create_env_fn, type) or not hasattr(create_env_fn, "step"))


def env_faults_for(create_env_fn: Any, env_kwargs: dict[str, Any], env_errors: str) -> EnvFaults | None:
    """The :class:`EnvFaults` of an engine whose env ``make_env(create_env_fn, **env_kwargs)`` builds, or ``None``
    where the env's exceptions are raised (``env_errors="raise"``)."""
    check_env_errors(create_env_fn, env_errors)
    if env_errors == "raise":
        return None
    return EnvFaults(lambda: make_env(create_env_fn, **env_kwargs))


class EnvFaults:
    """Rebuilds an env that raised, counts the rebuilds, and gives up after a few in a row.

    Args:
        make_env: builds a new env like the first (the collector's env factory with its ``env_kwargs``), for
            :meth:`recover`; coroutine envs are rebuilt one by one by their pool (:meth:`arecover`).
        max_in_a_row: rebuilds in a row, without a step taken between them, before an exception is raised.

    Attributes:
        restarts: envs rebuilt so far (each after an exception).
    """

    def __init__(
        self, make_env: Callable[[], EnvBase] | None = None, *, max_in_a_row: int = MAX_REBUILDS_IN_A_ROW
    ) -> None:
        self._make = make_env
        self.max_in_a_row = max_in_a_row
        self.restarts = 0
        #: rebuilds of one sub-env alone (or one coroutine env), by its index
        self.by_sub_env: dict[int, int] = {}
        #: why the whole env is rebuilt rather than the sub-env that raised (said in the warning); ``None``: no
        #: reason known (no engine asked)
        self.whole_because: str | None = None
        # Per env (None: a batched env rebuilt whole; i: coroutine env i), the rebuilds in a row and the step
        # count at the last fault: a fault after a step taken since then begins a new row.
        self._in_a_row: dict[int | None, int] = {}
        self._steps_at_last: dict[int | None, int] = {}

    def recover(self, env: EnvBase, error: Exception, *, steps: int, start: Callable[[EnvBase], None]) -> EnvBase:
        """Replaces ``env``, which raised ``error``, with a new env that ``start`` (the engine's reset) accepted.

        Args:
            env: the env that raised; it is closed here.
            error: what it raised.
            steps: the engine's step count: when it moved since the last fault, the fault is not one in a row.
            start: resets the new env into the engine's buffers; an exception from it is a fault of the new env.

        Returns:
            The new env, reset.

        Raises:
            Exception: the last exception (of the env, its factory or ``start``), as it is, after
                ``max_in_a_row`` rebuilds with no step taken between them.
        """
        assert self._make is not None, "an EnvFaults without make_env recovers coroutine envs only (arecover)"
        self._begin(None, steps)
        old: EnvBase | None = env
        n_envs = env.num_envs
        while True:
            try:
                self._count(None, error, self.whole_because)
            finally:  # closed before it is rebuilt, or before the error is raised
                if old is not None:
                    _close_quietly(old)
                    old = None
            try:
                old = self._make()
                if old.num_envs != n_envs:
                    raise EnvError(f"the rebuilt env has {old.num_envs} envs where the first had {n_envs}")
                start(old)
            except Exception as exc:
                error = exc
                continue
            self.restarts += 1
            return old

    async def arecover(self, i: int, error: Exception, *, steps: int, restart: Callable[[], Awaitable[None]]) -> None:
        """Coroutine env ``i`` raised ``error``: awaits ``restart`` (its pool rebuilds it, and it is reset) until it
        succeeds, or raises the last exception after ``max_in_a_row`` rebuilds with no step of env ``i`` between
        them.

        Args:
            i: the env's index in its pool.
            error: what it raised.
            steps: env ``i``'s step count: when it moved since its last fault, the fault is not one in a row.
            restart: rebuilds env ``i`` and resets it; an exception from it is a fault of the new env.
        """
        self._begin(i, steps)
        while True:
            self._count(i, error)
            try:
                await restart()
            except Exception as exc:
                error = exc
                continue
            self.restarts += 1
            self.by_sub_env[i] = self.by_sub_env.get(i, 0) + 1
            return

    def contain(self, i: int, error: Exception, *, restart: Callable[[], None]) -> None:
        """Sub-env ``i`` of a batched env raised ``error`` in a step: ``restart`` rebuilds it alone (and resets it
        and steps it) until that succeeds, or the last exception is raised after ``max_in_a_row`` rebuilds in a row
        (each raising before its first step went through).

        Args:
            i: the sub-env's index.
            error: what it raised.
            restart: rebuilds, resets and steps sub-env ``i``; an exception from it is a fault of the new sub-env.
        """
        self._in_a_row[i] = 0  # its rebuild before this one took a step: a new row
        while True:
            self._count(i, error)
            try:
                restart()
            except Exception as exc:
                error = exc
                continue
            self.restarts += 1
            self.by_sub_env[i] = self.by_sub_env.get(i, 0) + 1
            return

    def _begin(self, key: int | None, steps: int) -> None:
        if self._steps_at_last.get(key) != steps:
            self._in_a_row[key] = 0
        self._steps_at_last[key] = steps

    def _count(self, key: int | None, error: Exception, whole_because: str | None = None) -> None:
        """One more rebuild in a row of env ``key`` (logged), or ``error`` raised once they are spent."""
        which = "the env" if key is None else f"sub-env {key}"
        done = self._in_a_row.get(key, 0)
        if done >= self.max_in_a_row:
            logger.error(
                "%s raised again after %d rebuilds in a row without a step between them: giving up "
                "(env_errors='restart')",
                which,
                done,
            )
            raise error
        self._in_a_row[key] = done + 1
        how = "alone, the other sub-envs stepping on" if key is not None else "whole, from its factory"
        why = f" ({whole_because})" if whole_because else ""
        logger.warning(
            "%s raised %s: %s; rebuilding it %s%s (env_errors='restart', rebuild %d in a row of at most %d)",
            which,
            type(error).__name__,
            error,
            how,
            why,
            done + 1,
            self.max_in_a_row,
            exc_info=error,
        )


def _close_quietly(env: EnvBase) -> None:
    """Closes an env that raised: a broken env may fail to close too, which changes nothing here."""
    try:
        env.close()
    except Exception as exc:
        logger.warning("closing the env that raised failed too: %s: %s", type(exc).__name__, exc)
