"""A worker's rollout engine, built from its :class:`~acollect.worker.protocol.WorkerConfig`.

The env, the policy (sent whole, or built in the worker by ``policy_factory``), the devices and
the :class:`~acollect.rollout.RolloutEngine` that drives them (for an
:class:`~acollect.envs.AsyncEnvPool`, a :class:`~acollect.loop_rollout.LoopRollout`): what :mod:`acollect.worker.main`
runs, and the modules a weight push may name (:func:`resolve_model`).
"""

from __future__ import annotations

import threading
from typing import Any, cast

import torch

from acollect import rollout
from acollect.async_rollout import AsyncRollout
from acollect.engine import Engine
from acollect.engine_groups import EngineGroups
from acollect.envs import AsyncEnvPool, make_env
from acollect.errors import ConfigurationError
from acollect.inference.client import RemotePolicy
from acollect.loop_rollout import LoopRollout
from acollect.policy import build_policy, parse_exploration_type
from acollect.rollout import RolloutEngine
from acollect.worker import protocol as P
from acollect.worker.config_codec import resolve_import_path

__all__ = ["build_engine", "resolve_model"]


def build_engine(config: P.WorkerConfig, interrupt: threading.Event | None = None) -> RolloutEngine:
    """Builds the worker's env, policy and rollout engine from its config (with the one engine builder).

    With ``config.inference``, the policy is a :class:`~acollect.inference.client.RemotePolicy` asking the
    collector's inference server; ``interrupt`` (the worker's pause and stop) abandons a step waiting on it.
    With ``config.inference["env_groups"]`` above 1 and ``num_envs >= 2`` in ``env_kwargs``, the envs are built
    as that many groups (at most one per env), each stepping while the others wait for their actions
    (:class:`~acollect.engine_groups.EngineGroups`).
    """
    groups = _groups(config)
    if groups is None:
        engine = _engine(config, interrupt, config.env_kwargs, b"", 0, 1)
    else:
        # Each group takes as many steps per batch as one env of num_envs would: the batch is theirs side by side.
        steps = rollout.frames_per_batch_for(config.frames_per_batch, sum(groups)) // sum(groups)
        engines: list[RolloutEngine] = []
        try:
            for g, n_envs in enumerate(groups):
                suffix = b"" if g == 0 else str(g + 1).encode()
                engines.append(_engine(config, interrupt, {**config.env_kwargs, "num_envs": n_envs}, suffix, g,
                                       len(groups), n_envs * steps))  # fmt: skip
        except BaseException:
            for built in engines:
                built.close()
            raise
        # Typed as one engine: the groups have every part of the engine's interface a worker uses (collect,
        # allocate, counters, seed, restart, policy, env), and the workers' weight plans never target them (their
        # policy is remote).
        engine = cast(RolloutEngine, EngineGroups(engines))
    engine.next_traj_counter = config.next_traj_counter
    engine.frames = config.frames
    return engine


def _groups(config: P.WorkerConfig) -> list[int] | None:
    """The sizes of a worker's env groups, as even as can be (``None``: one group)."""
    n_envs = config.env_kwargs.get("num_envs")
    wanted = config.inference.get("env_groups", 1) if config.inference is not None else 1
    if type(wanted) is not int or wanted < 2 or config.init_random_frames:
        return None
    if type(n_envs) is not int or n_envs < 2:
        return None
    count = min(wanted, n_envs)
    return [n_envs // count + (1 if g < n_envs % count else 0) for g in range(count)]


def _engine(
    config: P.WorkerConfig,
    interrupt: threading.Event | None,
    env_kwargs: dict[str, Any],
    suffix: bytes,
    group: int,
    groups: int,
    frames_per_batch: int | None = None,
) -> RolloutEngine:
    policy = config.policy
    if config.inference is not None:
        source = P.worker_identity(config.index, config.generation) + b"i"
        # A worker started by hand proves itself with its own keys, to the inference server as to the collector
        # (both read the same allow-list); a worker the collector started got a key pair of its own for it.
        keys = config.keys if config.remote else config.inference.get("keys")
        policy = RemotePolicy(
            config.inference["address"],
            source + suffix,
            interrupt=interrupt,
            interrupted=rollout.RolloutInterrupted,
            keys=keys,
            slots=config.inference.get("slots"),
            source=source,  # a worker's groups count as one source: the server need not wait for both
        )
    # resolve_import_path: a worker started by hand gets its factories as "pkg.module:make_env".
    try:
        # Trajectory ids: worker k's group g takes offset k + g * n_workers, stride groups * n_workers.
        offset, stride = config.index + group * config.n_workers, groups * config.n_workers
        return _build(config, policy, env_kwargs, offset, stride, frames_per_batch or config.frames_per_batch)
    except BaseException:
        if isinstance(policy, RemotePolicy):
            policy.close()
        raise


def _build(
    config: P.WorkerConfig, policy: Any, env_kwargs: dict[str, Any], offset: int, stride: int, frames_per_batch: int
) -> RolloutEngine:
    env = make_env(resolve_import_path(config.create_env_fn), **env_kwargs)
    if isinstance(env, AsyncEnvPool):
        return _build_looped(config, policy, env, offset, stride, frames_per_batch)
    return rollout.build_engine(
        env,
        env_kwargs={},
        policy=policy,
        policy_factory=resolve_import_path(config.policy_factory),
        devices=config.devices,
        frames_per_batch=frames_per_batch,
        max_frames_per_traj=config.max_frames_per_traj,
        init_random_frames=config.init_random_frames,
        reset_at_each_iter=config.reset_at_each_iter,
        exploration_type=parse_exploration_type(config.exploration_type),
        traj_id_offset=offset,
        traj_id_stride=stride,
    )


def _build_looped(
    config: P.WorkerConfig, policy: Any, env: AsyncEnvPool, offset: int, stride: int, frames_per_batch: int
) -> RolloutEngine:
    """Coroutine envs: each env a task on an event loop of this worker's (see :mod:`acollect.loop_rollout`)."""
    try:
        if config.reset_at_each_iter:
            raise ConfigurationError.bad_value(
                "reset_at_each_iter", True, "False with an AsyncEnvPool (its envs run ahead into the next batch)"
            )
        adapter, devices = build_policy(
            env, policy=policy, policy_factory=resolve_import_path(config.policy_factory), devices=config.devices
        )
        engine = AsyncRollout(
            env,
            adapter,
            frames_per_batch=frames_per_batch,
            devices=devices,
            max_frames_per_traj=config.max_frames_per_traj,
            init_random_frames=config.init_random_frames,
            exploration_type=parse_exploration_type(config.exploration_type),
            traj_id_offset=offset,
            traj_id_stride=stride,
        )
    except BaseException:
        env.close()
        raise
    # The worker drives it through RolloutEngine's surface, which LoopRollout has (duck-typed).
    return cast(RolloutEngine, LoopRollout(engine))


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
