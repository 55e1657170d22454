"""One sub-env of a ``GymEnv`` rebuilt alone after it raised, its neighbours stepping on (``env_errors="restart"``).

:class:`SubEnvRebuilds` is what :meth:`GymEnv.contain_faults <acollect.envs.GymEnv.contain_faults>` sets up for a
plain ``SyncVectorEnv``, whose sub-envs the env steps one by one (:func:`~acollect.envs._gym_step.step_sub_envs`):
when sub-env ``i`` raises, the others are stepped as usual and the engine's handler is called for ``i``, with a
rebuild that makes a new sub-env from the vector env's own ``env_fns[i]``, resets it and takes its step from there.
A rebuilt sub-env is seeded from the seed of the last full reset, ``SeedSequence([seed, i, rebuild])``, so a run
whose sub-envs fail at the same steps repeats exactly.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Protocol

import numpy as np
import torch
from tensordict import TensorDictBase

from acollect.envs._base import SubEnvFaultHandler
from acollect.envs._gym_spaces import ObsLeaf, pick_leaf
from acollect.envs._gym_step import Binding, ResetFailedError, step_one, write_row

__all__ = ["SubEnvRebuilds", "rebuild_seed"]

logger = logging.getLogger("acollect")


def rebuild_seed(seed: int | None, i: int, rebuild: int) -> int | None:
    """The seed of sub-env ``i``'s ``rebuild``-th rebuild after a full reset with ``seed`` (``None``: unseeded).

    Examples:
        >>> rebuild_seed(7, 3, 1) == rebuild_seed(7, 3, 1) != rebuild_seed(7, 3, 2)
        True
        >>> rebuild_seed(None, 3, 1) is None
        True
    """
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, i, rebuild]).generate_state(1)[0])


class SubEnvsStepped(Protocol):
    """What a rebuild uses of a ``GymEnv`` (named here, not imported: that module imports this one)."""

    _leaves: list[ObsLeaf]
    _binding: Binding | None

    def _raise_if_outside(self, act: np.ndarray, exc: Exception) -> None: ...


class SubEnvRebuilds:
    """Rebuilds the sub-envs of one ``GymEnv``'s ``SyncVectorEnv`` that raise, one at a time.

    Args:
        env: the ``GymEnv`` (its bindings, leaves and action checks).
        vec: its ``SyncVectorEnv``.
        sub_envs: the list of sub-envs it steps (kept in step with ``vec.envs``).
        handler: the engine's (:data:`~acollect.envs._base.SubEnvFaultHandler`).
    """

    def __init__(self, env: SubEnvsStepped, vec: Any, sub_envs: list[Any], handler: SubEnvFaultHandler) -> None:
        self.env, self.vec, self.sub_envs, self.handler = env, vec, sub_envs, handler
        #: the step's actions: as given (for the policy's action check) and as stepped
        self.actions: tuple[np.ndarray, np.ndarray] | None = None
        self.seed: int | None = None
        self.rebuilds: dict[int, int] = {}

    def reseed(self, seed: int) -> None:
        """A full reset with ``seed``: later rebuilds derive their seeds from it (an unseeded reset changes nothing:
        the rebuilds after it go on from the last seed, as the sub-envs' own generators go on)."""
        self.seed, self.rebuilds = seed, {}

    def raised(self, i: int, error: Exception, ended: bool) -> None:
        """Sub-env ``i`` raised ``error`` in its step (or, ``ended``, in the reset after its episode ended)."""
        if self.actions is not None and not ended:
            self.env._raise_if_outside(self.actions[0], error)  # the policy's fault, not the sub-env's: raised
        self.handler(i, error, functools.partial(self.rebuild, i, ended), ended)

    def rebuild(self, i: int, ended: bool, first: TensorDictBase) -> None:
        """Rebuilds sub-env ``i`` from its factory, resets it (its first observation into row ``i`` of ``first``),
        and takes its step from there, unless its episode had ``ended`` (its first observation is then the one the
        next step starts from)."""
        _close_quietly(self.sub_envs[i])
        new = self.vec.env_fns[i]()
        self.vec.envs[i] = self.sub_envs[i] = new
        rebuild = self.rebuilds[i] = self.rebuilds.get(i, 0) + 1
        obs, _ = new.reset(seed=rebuild_seed(self.seed, i, rebuild))
        leaves = self.env._leaves
        for leaf in leaves:
            target = first.get(leaf.key)
            value = torch.as_tensor(np.asarray(pick_leaf(obs, leaf.path)))
            target[i] = value.to(dtype=target.dtype, device=target.device).reshape(target[i].shape)
        b = self.env._binding
        assert b is not None, "a sub-env is rebuilt inside a step, after the step's bindings were made"
        if ended:
            write_row(b.root_obs, i, obs, leaves)
            return
        assert self.actions is not None
        try:
            step_one(new, i, self.actions[1][i], b, leaves)
        except ResetFailedError as exc:
            raise exc.error from None  # a fault of the new sub-env all the same


def _close_quietly(env: Any) -> None:
    """Closes a sub-env that raised: a broken one may fail to close too, which changes nothing."""
    try:
        env.close()
    except Exception as exc:
        logger.warning("closing the sub-env that raised failed too: %s: %s", type(exc).__name__, exc)
