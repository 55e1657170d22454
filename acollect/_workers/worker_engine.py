"""A worker's rollout engine, built from its :class:`~acollect._workers.protocol.WorkerConfig`.

The config says what to build (the env factory, the policy sent whole or built here by ``policy_factory``, the
devices, the collection options) and, under central inference, which inference server chooses the actions; the
one engine builder (:func:`acollect._rollout.build.build_engine`) builds it, as it does for the in-process
collector. Also here: the modules a weight push may name (:func:`resolve_model`).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import replace
from typing import Any

import torch

from acollect._rollout.blocking import RolloutInterrupted
from acollect._rollout.build import build_engine as build_any_engine
from acollect._rollout.engine import BlockingEngine, Engine
from acollect._workers import protocol as P
from acollect._workers.config_codec import resolve_import_path
from acollect.errors import ConfigurationError
from acollect.inference.client import RemotePolicy

__all__ = ["build_engine", "resolve_model"]


def build_engine(config: P.WorkerConfig, interrupt: threading.Event | None = None) -> BlockingEngine:
    """Builds the worker's env, policy and rollout engine from its config (with the one engine builder).

    With ``config.inference``, the policy is a :class:`~acollect.inference.client.RemotePolicy` asking the
    collector's inference server; ``interrupt`` (the worker's pause and stop) abandons a step waiting on it.
    With ``config.inference["env_groups"]`` above 1 and ``num_envs >= 2`` in ``env_kwargs``, the envs are built
    as that many groups (at most one per env), each stepping while the others wait for their actions
    (:class:`~acollect._rollout.groups.EngineGroups`).
    """
    if config.rollout is None:
        raise ConfigurationError(f"worker {config.index}'s config holds no rollout spec: nothing to build")
    # resolve_import_path: a worker started by hand gets its factories as "pkg.module:make_env".
    spec = replace(
        config.rollout,
        create_env_fn=resolve_import_path(config.rollout.create_env_fn),
        policy_factory=resolve_import_path(config.rollout.policy_factory),
    )
    if config.inference is None:
        engine = build_any_engine(spec, blocking=True)
    else:
        remote = functools.partial(_remote_policy, config, config.inference, interrupt)
        engine = build_any_engine(
            spec,
            blocking=True,
            remote_policy=remote,
            env_groups=config.inference.get("env_groups", 1),
            require_groups=bool(config.inference.get("env_groups_required")),
        )
    engine.next_traj_counter = config.next_traj_counter
    engine.frames = config.frames
    return engine


def _remote_policy(
    config: P.WorkerConfig, inference: dict[str, Any], interrupt: threading.Event | None, group: int
) -> RemotePolicy:
    """The inference server's client for env group ``group`` of this worker."""
    source = P.worker_identity(config.index, config.generation) + b"i"
    # A worker started by hand proves itself with its own keys, to the inference server as to the collector
    # (both read the same allow-list); a worker the collector started got a key pair of its own for it.
    keys = config.keys if config.remote else inference.get("keys")
    return RemotePolicy(
        inference["address"],
        source + (b"" if group == 0 else str(group + 1).encode()),
        interrupt=interrupt,
        interrupted=RolloutInterrupted,
        keys=keys,
        slots=inference.get("slots"),
        source=source,  # a worker's groups count as one source: the server need not wait for both
    )


def resolve_model(engine: Engine, model_id: str) -> torch.nn.Module:
    """``"policy"``, ``"policy.<attr>..."`` or ``"env.<attr>..."`` -> the module whose weights are updated."""
    head, _, rest = model_id.partition(".")
    roots: dict[str, Any] = {"policy": engine.policy.weights_module, "env": engine.env}
    obj = roots.get(head)
    for part in rest.split(".") if rest else ():
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.nn.Module):
        raise LookupError(f"model_id={model_id!r} names no nn.Module in this worker")
    return obj
