"""A sub-env rebuilt alone after it raised (``env_errors="restart"``), and the batch mended around it.

An env whose sub-envs step one by one contains a sub-env's exception (:meth:`~acollect.envs.EnvBase.contain_faults`):
it steps the others as usual and hands the fault to :meth:`ContainedFaults.handler`, which has
:class:`~acollect._rollout.env_faults.EnvFaults` rebuild that sub-env alone (counted, logged, given up on after a
few in a row). The rebuilt sub-env takes its step from its first observation, so the engine's batch holds a real
transition there too; :meth:`ContainedFaults.mend` then makes the batch say what happened:

* the frame of the step shows the rebuilt sub-env's first observation (the engine had copied the old one);
* the old episode ends truncated at its last step recorded (in a batch handed out already, the new trajectory id
  alone marks its end);
* the new episode has a new trajectory id from that frame on.

The other sub-envs' rows are not touched: their episodes go on, step after step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from acollect._rollout.env_faults import EnvFaults
from acollect._rollout.keys import TransitionKeys
from acollect._rollout.trajectories import Trajectories
from acollect.envs import EnvBase

__all__ = ["ContainedFaults"]


class ContainedFaults:
    """The sub-envs rebuilt alone in the step just taken, for the engine to mend its batch around.

    Args:
        faults: counts, logs and limits the rebuilds.
        env: the batched env (its root layout receives the rebuilt sub-envs' first observations).
    """

    def __init__(self, faults: EnvFaults, env: EnvBase) -> None:
        self.faults = faults
        self.first = env.make_root()
        #: sub-envs rebuilt after a failed step in the step just taken (their frame is the new sub-env's first)
        self.rows: list[int] = []

    @classmethod
    def of(cls, faults: EnvFaults | None, env: EnvBase) -> ContainedFaults | None:
        """The contained faults of an engine of ``env``, if faults are survived (``faults``) and ``env`` can rebuild
        one sub-env alone; else ``None``, and ``faults`` says why the whole env is rebuilt in its warnings."""
        if faults is None:
            return None
        contained = cls(faults, env)
        if env.contain_faults(contained.handler):
            return contained
        faults.whole_because = f"{type(env).__name__} cannot rebuild one sub-env alone"
        return None

    def handler(self, i: int, error: Exception, restart: Callable[[TensorDictBase], None], ended: bool) -> None:
        """What the env calls when sub-env ``i`` raised (:data:`~acollect.envs._base.SubEnvFaultHandler`)."""
        self.faults.contain(i, error, restart=lambda: restart(self.first))
        if not ended:  # a reset that failed after the episode ended needs no mending: its frame was whole
            self.rows.append(i)

    def mend(
        self,
        batch: TensorDictBase,
        t: int,
        keys: TransitionKeys,
        trajectories: Trajectories,
    ) -> None:
        """Makes step ``t`` of ``batch`` say that the sub-envs of :attr:`rows` were rebuilt there (see the module)."""
        rows, self.rows = self.rows, []
        index = torch.tensor(rows, dtype=torch.int64)
        for key in [*keys.observations, *keys.flags]:
            batch.get(key)[index, t] = self.first.get(key)[index].to(batch.device)
        if t > 0:
            next_td = batch.get("next")
            before = next_td.get("terminated")[:, t - 1] | next_td.get("truncated")[:, t - 1]
            mask = torch.zeros(before.shape[0], dtype=torch.bool)
            mask[index] = True
            keys.cut(next_td, (slice(None), t - 1), mask & ~before.squeeze(-1).cpu())
        trajectories.start(rows)
