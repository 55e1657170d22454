"""A copy of a ``PettingZooEnv`` that raised, rebuilt alone while the other copies step on (``env_errors="restart"``).

:class:`CopyRebuilds` is what :meth:`PettingZooEnv.contain_faults <acollect.envs.PettingZooEnv.contain_faults>` sets
up: the env steps its copies one by one, so when copy ``i`` raises in its ``step`` (or in the reset after its episode
ended), the other copies are stepped as usual and the engine's handler is called for ``i``, with a rebuild that makes
a new copy from the env's own ``env_fn()``, resets it and takes its step from there. A rebuilt copy is seeded from the
seed of the last seeded full reset, ``SeedSequence([seed, i, rebuild])``
(:func:`~acollect.envs._gym_faults.rebuild_seed`, as a ``GymEnv``'s sub-envs are), so a run whose copies fail at the
same steps repeats exactly.

:func:`raise_if_outside` tells the policy's fault from the copy's: a copy that refused an action outside its agent's
space would refuse it again once rebuilt, so that is raised as a :class:`~acollect.errors.PolicyError`, not contained.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces
from tensordict import TensorDictBase

from acollect.envs._base import SubEnvFaultHandler
from acollect.envs._gym_faults import _close_quietly, rebuild_seed
from acollect.errors import PolicyError

__all__ = ["CopyRebuilds", "raise_if_outside"]


class Copies(Protocol):
    """What a rebuild uses of a ``PettingZooEnv`` (named here, not imported: that module imports this one)."""

    _envs: list[Any]

    def _reset_row(self, i: int, seed: int | None) -> None: ...

    def _write(self, out: TensorDictBase, rows: list[int] | None, *, with_reward: bool) -> None: ...

    def _step_row(self, i: int, acts: dict[str, np.ndarray]) -> bool: ...


class CopyRebuilds:
    """Rebuilds the copies of one ``PettingZooEnv`` that raise, one at a time.

    Args:
        env: the ``PettingZooEnv`` (its copies, and how it resets, steps and writes one).
        build: makes a new copy (the env's ``env_fn()``, checked as the first copies were).
        handler: the engine's (:data:`~acollect.envs._base.SubEnvFaultHandler`).
    """

    def __init__(self, env: Copies, build: Callable[[], Any], handler: SubEnvFaultHandler) -> None:
        self.env, self.build, self.handler = env, build, handler
        self.seed: int | None = None
        self.rebuilds: dict[int, int] = {}

    def reseed(self, seed: int) -> None:
        """A full reset with ``seed``: later rebuilds derive their seeds from it (an unseeded reset changes nothing:
        the rebuilds after it go on from the last seed, as the copies' own generators go on)."""
        self.seed, self.rebuilds = seed, {}

    def raised(
        self, i: int, error: Exception, acts: dict[str, np.ndarray], finished: list[int], *, ended: bool
    ) -> None:
        """Copy ``i`` raised ``error`` in its step (or, ``ended``, in the reset after its episode ended).

        Args:
            i: the copy.
            error: what it raised.
            acts: the step's actions, ``{group: [num_envs, n_agents, ...]}``, as the copies are stepped with them.
            finished: the copies whose episode ended at this step (reset once every copy stepped): a rebuilt copy
                whose step ends its episode joins them.
            ended: its step went through and ended the episode, and the reset after it raised.
        """
        if isinstance(error, PolicyError):
            raise error  # the policy's fault (raise_if_outside): a rebuilt copy would refuse the same action
        self.handler(i, error, functools.partial(self.rebuild, i, acts, finished, ended), ended)

    def rebuild(
        self, i: int, acts: dict[str, np.ndarray], finished: list[int], ended: bool, first: TensorDictBase
    ) -> None:
        """Rebuilds copy ``i``, resets it (its first observation into row ``i`` of ``first``) and takes its step from
        there, unless its episode had ``ended`` (its first observation is then the one the next step starts from)."""
        env = self.env
        _close_quietly(env._envs[i])
        env._envs[i] = self.build()  # in place before its reset: a retry closes it, as closing the env would
        rebuild = self.rebuilds[i] = self.rebuilds.get(i, 0) + 1
        # The stage's row i is rewritten whole by the reset: what the copy that raised left there is gone.
        env._reset_row(i, rebuild_seed(self.seed, i, rebuild))
        env._write(first, [i], with_reward=False)
        if not ended and env._step_row(i, acts):
            finished.append(i)  # reset with the others that finished, after next_out is written


def raise_if_outside(
    i: int, step_actions: dict[str, Any], action_spaces: dict[str, spaces.Space[Any]], exc: Exception
) -> None:
    """Raises :class:`PolicyError` if an action copy ``i`` was given (and raised ``exc`` at) is outside its space.

    Checked only once the copy raised: an env may well take an action outside its ``Box`` (clipping it), and a check
    on every step would cost every step.

    Args:
        i: the copy.
        step_actions: ``{agent: action}``, as the copy was stepped with them.
        action_spaces: ``{agent: its action space}``.
        exc: what the copy raised (chained, and named in the message).

    Examples:
        >>> boxes = {"a_0": spaces.Discrete(3)}
        >>> raise_if_outside(0, {"a_0": 2}, boxes, ValueError("boom"))  # inside: the copy's own fault
        >>> raise_if_outside(1, {"a_0": 5}, boxes, ValueError("boom"))
        Traceback (most recent call last):
        ...
        acollect.errors.PolicyError: the policy's action 5 for agent 'a_0' (copy 1) is outside its action space ...
    """
    for agent, value in step_actions.items():
        space = action_spaces[agent]
        if not space.contains(value):
            raise PolicyError(
                f"the policy's action {np.asarray(value).tolist()!r} for agent {agent!r} (copy {i}) is outside its "
                f"action space {space} ({type(exc).__name__} from the env: {exc})"
            ) from exc
