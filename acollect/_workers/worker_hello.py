"""What a worker's hello said, as the collector keeps it: the envs it steps, its batch layout, its policy's weights.

A :class:`WorkerHello` is read once from the ``hello`` message (:meth:`WorkerHello.parse`) and held by the worker's
:class:`~acollect._workers.handles.WorkerHandle` until its next hello (a restarted worker says it again).

Examples:
    >>> hello = WorkerHello.parse({"n_envs": 2, "layout": {"leaves": [{"nbytes": 32}, {"nbytes": 8}]}})
    >>> hello.n_envs, hello.batch_nbytes, hello.weights_structure, hello.env_seed
    (2, 40, None, None)
    >>> WorkerHello().n_envs  # before its first hello
    0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from acollect._weights.updates import WeightStructure, decode_structure

__all__ = ["WorkerHello"]


@dataclass(frozen=True)
class WorkerHello:
    """What one worker said in its hello (the defaults: before its first one)."""

    n_envs: int = 0  # envs it steps
    layout: dict[str, Any] | None = None  # its batch layout
    batch_nbytes: int = 0  # tensor bytes of one of its batches (from its layout)
    weights_structure: WeightStructure | None = None  # its policy's weights (``None``: unknown)
    env_seed: int | None = None  # the seed its env was built with where only building seeds it (EnvPool)
    pipe: object = None  # where it says it made its pipe (opened only where the collector named it)

    @classmethod
    def parse(cls, header: dict[str, Any]) -> WorkerHello:
        """The hello in a ``hello`` message's header (a malformed one raises ``KeyError``, ``TypeError`` or
        ``ValueError``, which the receive loop reports as a protocol error)."""
        seed = header.get("env_seed")
        return cls(
            n_envs=int(header["n_envs"]),
            layout=header["layout"],
            batch_nbytes=sum(int(leaf["nbytes"]) for leaf in header["layout"]["leaves"]),
            weights_structure=decode_structure(header.get("weights")),
            env_seed=None if seed is None else int(seed),
            pipe=header.get("pipe"),
        )
