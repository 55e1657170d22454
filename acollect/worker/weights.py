"""A worker's side of a weight push: read the message, then check every model before copying any.

A push arrives as frames, as a shared-memory segment written once for every local
worker, or (``DistributedCollector``) as a torch.distributed broadcast. Whatever the
road, :func:`plan_weights` checks each model against this worker's own policy
first, so a push that does not fit changes nothing and the worker can refuse it and
go on collecting.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ProtocolError
from acollect.rollout import RolloutEngine
from acollect.transport.shm import ShmSegment
from acollect.transport.torch_dist import DistLink
from acollect.transport.weights import WeightPlan, plan_unflatten
from acollect.worker.build import resolve_model

__all__ = ["plan_weights", "read_weights"]

Staged = dict[str, tuple[Any, torch.Tensor]]


def read_weights(
    header: dict[str, Any], td: TensorDictBase | None, segments: dict[str, ShmSegment], dist: DistLink | None
) -> Staged:
    """model id -> (layout, flat buffer) of a ``weights`` message (from frames, a segment or a broadcast).

    ``segments`` caches the shared-memory segments attached so far (one per model, rewritten by each push).
    """
    models = header["models"]
    if not isinstance(models, list):
        raise ProtocolError(f"weights models is a {type(models).__name__}, expected a list")
    staged: Staged = {}
    # DistributedCollector: the flat buffers follow as one broadcast per model, not as frames.
    broadcast = (
        dist.recv_weights([int(m["layout"]["nbytes"]) for m in models])
        if header.get("dist") and dist is not None
        else None
    )
    for i, model in enumerate(models):
        shm = model.get("shm")
        if broadcast is not None:
            flat = broadcast[i]
        elif shm is not None:
            segment = segments.get(shm)
            if segment is None:
                segment = ShmSegment.attach(shm, int(model["layout"]["nbytes"]))
                segments[shm] = segment
            flat = segment.tensor()
        else:
            frame = td.get(f"m{i}") if td is not None else None
            if not isinstance(frame, torch.Tensor):
                raise ProtocolError(f"weights message lacks the frame of model {i}")
            flat = frame
        staged[str(model["id"])] = (model["layout"], flat)
    return staged


def plan_weights(engine: RolloutEngine | None, weights: Staged) -> list[WeightPlan]:
    """Checks every model before any is copied, so a bad push changes nothing."""
    if engine is None:
        raise ProtocolError("this worker has no policy to load weights into")
    targets = {model_id: TensorDict.from_module(resolve_model(engine, model_id)) for model_id in weights}
    return [plan_unflatten(layout, flat, targets[model_id]) for model_id, (layout, flat) in weights.items()]
