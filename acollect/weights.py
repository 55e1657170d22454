"""Versioned policy weights for the in-process collector.

Weights handed to a collector are *staged* (snapshotted, so the trainer may
keep training its own copy) and applied by the rollout thread at the next
batch boundary, or at once when no batch is in flight. The version counts
updates; every frame of a batch carries the version it was collected with.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ConfigurationError

if TYPE_CHECKING:
    from acollect.rollout import RolloutEngine

__all__ = ["PolicyWeights", "weights_of"]

Weights = TensorDictBase | Mapping[str, torch.Tensor]


def weights_of(source: object, target: torch.nn.Module | None) -> Weights | None:
    """A snapshot of the weights in ``source``, or ``None`` when ``source`` *is* ``target``.

    Args:
        source: an ``nn.Module``, a TensorDict of weights, or a state dict.
        target: the module the collector runs, if known.

    Raises:
        ConfigurationError: ``source`` holds no weights.
    """
    with torch.no_grad():
        if isinstance(source, torch.nn.Module):
            if source is target:
                return None  # the collector runs this very module: nothing to copy
            return TensorDict.from_module(source).detach().clone()
        if isinstance(source, TensorDictBase):
            return source.detach().clone()
        if isinstance(source, Mapping) and all(isinstance(v, torch.Tensor) for v in source.values()):
            return {k: v.detach().clone() for k, v in source.items()}
    raise ConfigurationError.bad_value(
        "policy_or_weights",
        source,
        "an nn.Module, a TensorDict of weights or a state dict (the collector was built without a policy "
        "holding weights: pass one)",
    )


class PolicyWeights:
    """Staged weights and the version counter of one collector."""

    def __init__(self) -> None:
        self.version = 0
        self._pending: Weights | None = None
        self._lock = threading.Lock()

    @staticmethod
    def place(policy: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The policy on ``device``: itself if it is there already, else a copy moved there."""
        for tensor in (*policy.parameters(), *policy.buffers()):
            if tensor.device != device:
                return copy.deepcopy(policy).to(device)
        return policy

    def stage(self, weights: Weights | None, *, bump: bool = True) -> None:
        """Keeps ``weights`` for the next batch boundary and bumps the version."""
        with self._lock:
            if weights is not None:
                self._pending = weights
            if bump:
                self.version += 1

    def apply_pending(self, engine: RolloutEngine) -> None:
        """Copies staged weights into the engine's policy and stamps the version. Call between batches."""
        with self._lock:
            pending, self._pending = self._pending, None
            version = self.version
        if pending is not None:
            module = engine.policy.weights_module
            if module is None:
                raise ConfigurationError.bad_value(
                    "policy_or_weights", type(pending).__name__, "a collector whose policy is an nn.Module"
                )
            load_weights(module, pending)
        engine.policy_version = version


def load_weights(module: torch.nn.Module, weights: Any) -> None:
    """Copies ``weights`` (TensorDict or state dict) into ``module``'s tensors in place."""
    with torch.no_grad():
        if isinstance(weights, TensorDictBase):
            dest = TensorDict.from_module(module)
            mismatch = set(dest.keys(True, True)) ^ set(weights.keys(True, True))
            if mismatch:
                raise ConfigurationError.bad_value(
                    "policy_or_weights", sorted(map(str, mismatch))[:5], "weights with the policy's parameter names"
                )
            dest.update_(weights.to(dest.device) if dest.device is not None else weights)
        else:
            module.load_state_dict(dict(weights))
