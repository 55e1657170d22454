"""Probe policies: tiny models whose actions show which weights produced them.

They act on the counting envs of :mod:`acollect.testing._envs` (``Categorical(2)``
actions by default) and are plain ``nn.Module`` classes defined at module level, so a
collector can pickle them to worker processes, Ray actors or submitit jobs,
which import them by their module path ``acollect.testing._policies``.

* :class:`WeightProbe`: acts ``clamp(w, 0, 1)`` with one parameter ``w``:
  push ``WeightProbe(1.0)`` to a collector started with ``WeightProbe(0.0)``
  and the actions in its batches go from 0 to 1 once the new weights landed;
  ``WeightProbe(0.0, high=n - 1)`` on an env of ``n`` actions (``CountingEnv(n_actions=n)``)
  tells ``n`` weight versions apart, so that a frame acting with an older push's weights shows;
* :class:`Doubler`: ``2 * observation``, no weights: each caller of a batched server can check it got
  its own rows back;
* :class:`TwoPartProbe`: two :class:`WeightProbe` sub-models ``a`` and ``b``,
  acting ``clamp(a.w * b.w, 0, 1)``: for updates of several models, or of
  parts of one (``weights_dict={"policy.a": ..., "policy.b": ...}``).

Besides them, :class:`SplitProbe` is a policy adapter whose calls split in two as an inference server's
client's do (:class:`~acollect._policy.SplitPolicy`), and which records them: env groups run on it without
a server.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from acollect._policy import NestedKey, PolicyAdapter

__all__ = ["Doubler", "SplitProbe", "TwoPartProbe", "WeightProbe"]


class WeightProbe(torch.nn.Module):
    """A policy acting ``clamp(w, 0, high)`` on every env: the actions in a batch show which weights collected it.

    It reads the ``"observation"`` key (only for its batch shape) and writes an
    int64 ``"action"`` of shape ``[n_envs]``.

    Args:
        value: the initial weight ``w`` (a ``Parameter`` of shape ``(1,)``).
        high: the largest action (not a weight: a push of ``w`` alone keeps it). ``1`` suits the counting envs'
            two actions; with ``CountingEnv(n_actions=n)``, ``high=n - 1`` gives each of ``n`` weights its own
            action.

    Examples:
        >>> import torch
        >>> probe = WeightProbe(0.0)
        >>> probe(torch.zeros(3, 1)).tolist()
        [0, 0, 0]
        >>> _ = probe.load_state_dict(WeightProbe(1.0).state_dict())
        >>> probe(torch.zeros(3, 1)).tolist()
        [1, 1, 1]
        >>> wide = WeightProbe(0.0, high=7)
        >>> _ = wide.load_state_dict(WeightProbe(5.0).state_dict())
        >>> wide(torch.zeros(2, 1)).tolist()
        [5, 5]
    """

    def __init__(self, value: float = 0.0, *, high: int = 1) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), float(value)))
        self.high = high

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).clamp(0, self.high).long()


class TwoPartProbe(torch.nn.Module):
    """A policy of two :class:`WeightProbe` parts ``a`` and ``b``, acting ``clamp(a.w * b.w, 0, 1)``.

    It acts 1 only once *both* parts hold a weight of 1 or more: a test of a
    multi-model weight update sees whether every part arrived.

    Args:
        a: the initial weight of part ``a``.
        b: the initial weight of part ``b``.

    Examples:
        >>> import torch
        >>> probe = TwoPartProbe()
        >>> _ = probe.a.load_state_dict(WeightProbe(1.0).state_dict())
        >>> probe(torch.zeros(2, 1)).tolist()  # b still holds 0
        [0, 0]
        >>> _ = probe.b.load_state_dict({"w": torch.ones(1)})
        >>> probe(torch.zeros(2, 1)).tolist()
        [1, 1]
    """

    def __init__(self, a: float = 0.0, b: float = 0.0) -> None:
        super().__init__()
        self.a = WeightProbe(a)
        self.b = WeightProbe(b)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.a.w * self.b.w).clamp(0, 1).long()


class Doubler(torch.nn.Module):
    """A policy acting ``2 * observation``: a caller of a batched server sees that the answer is to its own rows.

    Examples:
        >>> Doubler()(torch.tensor([[1.0, 2.0]])).tolist()
        [[2.0, 4.0]]
    """

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation * 2


class SplitProbe(PolicyAdapter):
    """A policy adapter acting ``action`` on every env, whose calls split in two (``submit``, then ``receive``).

    It is a :class:`~acollect._policy.SplitPolicy`, as an inference server's client is, and appends
    ``"submit"`` and ``"receive"`` to :attr:`calls` as they come: a test sees where an engine yields.

    Args:
        action: the action of every env.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> probe = SplitProbe(1)
        >>> probe.submit(TensorDict({}, batch_size=[3]))
        >>> probe.receive()["action"].tolist(), probe.calls
        ([1, 1, 1], ['submit', 'receive'])
    """

    def __init__(self, action: int = 0) -> None:
        self.action = action
        #: the calls so far, in order
        self.calls: list[str] = []
        self._rows = 0

    def __call__(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        self.submit(td)
        return self.receive()

    def submit(self, td: TensorDictBase) -> None:
        self.calls.append("submit")
        self._rows = int(td.batch_size[0])

    def receive(self) -> dict[NestedKey, torch.Tensor]:
        self.calls.append("receive")
        return {"action": torch.full((self._rows,), self.action, dtype=torch.int64)}

    def answer_fileno(self) -> int | None:
        """``None``: the answer is there as soon as it is asked for."""
        return None
