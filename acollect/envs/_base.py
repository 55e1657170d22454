"""The env protocol the rollout engine drives.

An acollect env is *batched*: it always holds ``n_envs >= 1`` sub-envs and
reads and writes TensorDicts of batch size ``[n_envs]``. Specs describe one
sub-env (no batch dim). Scalars such as ``reward`` and the done flags have a
trailing dim of 1, as in TorchRL.

Two ways to drive an env:

* the convenience API, which allocates: ``reset() -> TensorDict`` and
  ``step(td) -> TensorDict`` (``td`` holds ``"action"``; the result holds the
  next observation keys, ``reward``, ``done``, ``terminated``, ``truncated``);
* the hot-path API the rollout engine uses, which writes into TensorDicts the
  caller allocated once: :meth:`EnvBase.reset_into` and
  :meth:`EnvBase.step_and_reset_into`. Subclasses implement these two.

Several agents, or several actions and rewards (TorchRL's ``action_keys``, ``reward_keys`` and ``done_keys``):
an env whose ``action_spec`` (or ``reward_spec``) is a :class:`~acollect.specs.Composite` takes (gives) every leaf
of it, at any nesting, e.g. ``("agents", "action")`` of shape ``[n_agents, ...]``; the action it is stepped with is
then a TensorDict ``[n_envs]`` of those keys. Its ``done_spec`` adds flags beside the root ones, such as
``("agents", "done")``, ``("agents", "terminated")`` and ``("agents", "truncated")``, written like them. The root
flags stay: an episode ends when the root ``done`` does.

Episode ends are the env's job: after a step in which sub-env ``i`` finished
(``terminated | truncated``), ``step_and_reset_into`` writes the *true* final
observation of ``i`` into ``next_out`` and the *fresh* observation after its
reset into ``root_out``. No transition that did not happen ever reaches the
caller (gymnasium's NEXT_STEP autoreset no-op step included).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ConfigurationError
from acollect.specs import Composite, TensorSpec, Unbounded

__all__ = ["DONE_KEYS", "EnvBase", "SubEnvFaultHandler"]

#: The three boolean flags every env writes, each of shape ``[n_envs, 1]``.
DONE_KEYS: tuple[str, str, str] = ("done", "terminated", "truncated")

#: What an env that contains its sub-envs' faults (:meth:`EnvBase.contain_faults`) calls when sub-env ``index``
#: raised ``error``: ``handler(index, error, restart, ended)``. ``restart(first)`` rebuilds that sub-env alone,
#: resets it (its first observation written into row ``index`` of ``first``, a TensorDict of :meth:`make_root`'s
#: layout) and, unless ``ended`` (its episode had ended at this step and its reset raised), steps it with the
#: action it was given, writing the step into ``next_out`` and ``root_out`` as the step of any sub-env. The handler
#: calls ``restart`` (again if it raises, up to its limit) or raises.
SubEnvFaultHandler = Callable[[int, Exception, Callable[[TensorDictBase], None], bool], None]


def _leaves(spec: TensorSpec | Composite, single: str) -> list[tuple[str, ...]]:
    return spec.leaf_keys() if isinstance(spec, Composite) else [(single,)]


class _Phase(enum.Enum):
    """Where an env is in its life: open until :meth:`EnvBase.close`, which runs the subclass's ``_close()`` once."""

    OPEN = "open"
    CLOSED = "closed"  # ``close()`` was called (even if its ``_close()`` raised: it is never run twice)


class EnvBase(abc.ABC):
    """A batched environment with TensorDict in/out.

    Subclasses set :attr:`batch_size`, :attr:`observation_spec`,
    :attr:`action_spec` (and optionally :attr:`reward_spec`) in ``__init__``
    and implement :meth:`reset_into`, :meth:`step_and_reset_into` and
    :meth:`_close`.

    Attributes:
        batch_size: ``torch.Size([n_envs])``.
        device: where the env's tensors live.
        observation_spec: per-sub-env spec of the observation keys.
        action_spec: per-sub-env spec of ``"action"``, or a :class:`~acollect.specs.Composite` of the action keys.
        reward_spec: per-sub-env spec of ``"reward"`` (default ``Unbounded((1,))``), or a
            :class:`~acollect.specs.Composite` of the reward keys.
        done_spec: the done flags beside the root ones (bool, e.g. per agent), or ``None`` (the default): only
            ``"done"``, ``"terminated"`` and ``"truncated"``, each of shape ``[1]``.
        build_seed: the seed the env was built with where only building seeds it (an EnvPool env: sub-env ``i``
            starts from ``build_seed + i``, and its reset takes no seed); ``None`` (the default): ``reset_into``
            seeds it.

    Examples:
        >>> from acollect.testing import CountingEnv
        >>> env = CountingEnv(num_envs=2, episode_length=3)
        >>> td = env.reset()
        >>> td["observation"].shape
        torch.Size([2, 1])
        >>> out = env.step(td.set("action", env.action_spec.rand((2,))))
        >>> sorted(out.keys())
        ['done', 'observation', 'reward', 'terminated', 'truncated']
        >>> env.close()
    """

    batch_size: torch.Size
    device: torch.device = torch.device("cpu")
    observation_spec: Composite
    action_spec: TensorSpec | Composite
    reward_spec: TensorSpec | Composite = Unbounded((1,))
    done_spec: Composite | None = None
    build_seed: int | None = None
    _phase: _Phase = _Phase.OPEN  # a class default: a subclass need not call ``super().__init__()``

    @property
    def num_envs(self) -> int:
        """Number of sub-envs (``batch_size[0]``)."""
        return int(self.batch_size[0])

    @property
    def action_keys(self) -> list[tuple[str, ...]]:
        """The keys a policy writes and a step reads: ``[("action",)]``, or the leaves of a composite action spec."""
        return _leaves(self.action_spec, "action")

    @property
    def reward_keys(self) -> list[tuple[str, ...]]:
        """The keys a step's rewards go to: ``[("reward",)]``, or the leaves of a composite reward spec."""
        return _leaves(self.reward_spec, "reward")

    @property
    def done_keys(self) -> list[tuple[str, ...]]:
        """Every done flag: the root ``done``, ``terminated`` and ``truncated``, then those of :attr:`done_spec`."""
        return [(key,) for key in DONE_KEYS] + (self.done_spec.leaf_keys() if self.done_spec is not None else [])

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._phase is _Phase.CLOSED

    @property
    def _closed(self) -> bool:  # what subclasses read
        return self._phase is _Phase.CLOSED

    # -- hot-path API: implemented by subclasses --------------------------------
    @abc.abstractmethod
    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        """Resets sub-envs and writes their first observation into ``out``.

        Args:
            out: a TensorDict built by :meth:`make_root`; the observation keys
                and done flags (set to False) of the reset sub-envs are
                overwritten in place, the others are left as they were.
            mask: bool ``[n_envs]``; ``None`` resets every sub-env.
            seed: seeds sub-env ``i`` with ``seed + i`` (only with ``mask=None``).
        """

    @abc.abstractmethod
    def step_and_reset_into(self, action: Any, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        """Steps every sub-env with ``action``, resetting the ones that finished.

        Args:
            action: ``[n_envs, *action_spec.shape]`` on :attr:`device`; a TensorDict ``[n_envs]`` of
                :attr:`action_keys` where the action spec is composite.
            next_out: receives the transition's result: observation keys,
                ``reward`` and the done flags (built by :meth:`make_next`).
            root_out: receives what the next step starts from: the observation
                (the reset one where a sub-env finished) and done flags that
                are False wherever a reset happened (built by :meth:`make_root`).
        """

    @abc.abstractmethod
    def _close(self) -> None:
        """Releases the env's resources."""

    def contain_faults(self, handler: SubEnvFaultHandler) -> bool:
        """Asks the env to rebuild a sub-env that raises alone, its neighbours stepping on (``env_errors="restart"``).

        An env whose sub-envs step one by one (a ``GymEnv`` of sync vectorisation, ``PettingZooEnv``) can: from now
        on, when sub-env ``i`` raises in :meth:`step_and_reset_into`, it steps the others as usual and calls
        ``handler`` (:data:`SubEnvFaultHandler`) for ``i`` before returning. A sub-env rebuilt in its step takes the
        action it was given, from its first observation.

        Returns:
            Whether the env will; ``False`` (the default): a sub-env's exception is raised out of the step, and
            the whole env is rebuilt.
        """
        return False

    # -- shared helpers ------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        """Seeds the env: resets every sub-env, sub-env ``i`` with ``seed + i``."""
        self.reset_into(self.make_root(), seed=seed)

    def close(self) -> None:
        """Closes the env; calling it twice is fine."""
        if self._phase is _Phase.OPEN:
            self._phase = _Phase.CLOSED
            self._close()

    def _closed_unbuilt(self) -> None:
        """Marks the env closed without running ``_close()``: a constructor that failed released what it built."""
        self._phase = _Phase.CLOSED

    def make_root(self) -> TensorDict:
        """Allocates a TensorDict for :meth:`reset_into` and ``root_out``."""
        td = self.observation_spec.zero(self.batch_size)
        for key in DONE_KEYS:
            td.set(key, torch.zeros((*self.batch_size, 1), dtype=torch.bool, device=self.device))
        if self.done_spec is not None:
            for flag, spec in self.done_spec.leaf_items():
                td.set(flag, spec.zero(self.batch_size))
        return td

    def make_next(self) -> TensorDict:
        """Allocates a TensorDict for ``next_out`` of :meth:`step_and_reset_into`."""
        td = self.make_root()
        if isinstance(self.reward_spec, Composite):
            for key, spec in self.reward_spec.leaf_items():
                td.set(key, spec.zero(self.batch_size))
        else:
            td.set("reward", self.reward_spec.zero(self.batch_size))
        return td

    def reset(self, *, seed: int | None = None) -> TensorDict:
        """Resets every sub-env; returns observation keys and done flags."""
        self._check_open()
        out = self.make_root()
        self.reset_into(out, seed=seed)
        self._root = out.clone()
        return out

    def step(self, td: TensorDictBase) -> TensorDict:
        """Steps with ``td["action"]`` (every one of :attr:`action_keys`); returns the transition's result.

        Sub-envs that finished are reset automatically; the observation the
        next step starts from is in :attr:`last_root`.
        """
        self._check_open()
        next_out = self.make_next()
        root_out = getattr(self, "_root", None)
        if root_out is None:
            root_out = self.make_root()
        action = td.select(*self.action_keys) if isinstance(self.action_spec, Composite) else td.get("action")
        self.step_and_reset_into(action, next_out, root_out)
        self._root = root_out
        return next_out

    @property
    def last_root(self) -> TensorDict | None:
        """The observation the next :meth:`step` starts from (after auto-resets)."""
        return getattr(self, "_root", None)

    def _mask_rows(self, mask: torch.Tensor | None) -> np.ndarray | None:
        """The sub-envs a reset's ``mask`` picks: ``None`` for every one (no mask, or one of all True), else a numpy
        bool array ``[n_envs]``, which may pick none.

        Raises:
            ConfigurationError: ``mask`` does not hold one entry per sub-env.
        """
        if mask is None:
            return None
        rows = mask.detach().reshape(-1).to(device="cpu", dtype=torch.bool).numpy()
        if rows.shape != (self.num_envs,):
            raise ConfigurationError.bad_value("mask", tuple(mask.shape), f"a bool tensor of shape ({self.num_envs},)")
        return None if rows.all() else rows

    def _check_open(self) -> None:
        if self._closed:
            from acollect.errors import EnvError

            raise EnvError(f"{type(self).__name__} is closed: it cannot be reset or stepped.")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, observation_spec={self.observation_spec}, "
            f"action_spec={self.action_spec})"
        )

    def __del__(self) -> None:  # best effort: envs sometimes own processes
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def __enter__(self) -> EnvBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
