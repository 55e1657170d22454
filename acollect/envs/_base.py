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

Episode ends are the env's job: after a step in which sub-env ``i`` finished
(``terminated | truncated``), ``step_and_reset_into`` writes the *true* final
observation of ``i`` into ``next_out`` and the *fresh* observation after its
reset into ``root_out``. No transition that did not happen ever reaches the
caller (gymnasium's NEXT_STEP autoreset no-op step included).
"""

from __future__ import annotations

import abc
import enum
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect.specs import Composite, TensorSpec, Unbounded

__all__ = ["DONE_KEYS", "EnvBase"]

#: The three boolean flags every env writes, each of shape ``[n_envs, 1]``.
DONE_KEYS: tuple[str, str, str] = ("done", "terminated", "truncated")


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
        action_spec: per-sub-env spec of ``"action"``.
        reward_spec: per-sub-env spec of ``"reward"`` (default ``Unbounded((1,))``).
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
    action_spec: TensorSpec
    reward_spec: TensorSpec = Unbounded((1,))
    build_seed: int | None = None
    _phase: _Phase = _Phase.OPEN  # a class default: a subclass need not call ``super().__init__()``

    @property
    def num_envs(self) -> int:
        """Number of sub-envs (``batch_size[0]``)."""
        return int(self.batch_size[0])

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
    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        """Steps every sub-env with ``action``, resetting the ones that finished.

        Args:
            action: ``[n_envs, *action_spec.shape]`` on :attr:`device`.
            next_out: receives the transition's result: observation keys,
                ``reward`` and the done flags (built by :meth:`make_next`).
            root_out: receives what the next step starts from: the observation
                (the reset one where a sub-env finished) and done flags that
                are False wherever a reset happened (built by :meth:`make_root`).
        """

    @abc.abstractmethod
    def _close(self) -> None:
        """Releases the env's resources."""

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
        return td

    def make_next(self) -> TensorDict:
        """Allocates a TensorDict for ``next_out`` of :meth:`step_and_reset_into`."""
        td = self.make_root()
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
        """Steps with ``td["action"]``; returns the transition's result.

        Sub-envs that finished are reset automatically; the observation the
        next step starts from is in :attr:`last_root`.
        """
        self._check_open()
        next_out = self.make_next()
        root_out = getattr(self, "_root", None)
        if root_out is None:
            root_out = self.make_root()
        self.step_and_reset_into(td.get("action"), next_out, root_out)
        self._root = root_out
        return next_out

    @property
    def last_root(self) -> TensorDict | None:
        """The observation the next :meth:`step` starts from (after auto-resets)."""
        return getattr(self, "_root", None)

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
