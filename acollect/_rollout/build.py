"""The one engine builder: an env, a policy and devices in, the engine that drives them out.

Which engine :func:`build_engine` builds (each an :class:`~acollect._rollout.engine.Engine`):

* for an :class:`~acollect.envs.AsyncEnvPool` (coroutine envs), an :class:`~acollect._rollout.coroutines.AsyncRollout`,
  each env a task on the caller's event loop; for blocking code (a worker process), the same inside a
  :class:`~acollect._rollout.own_loop.LoopRollout`, on an event loop of its own;
* for any other env, a :class:`~acollect._rollout.blocking.RolloutEngine`;
* for a worker of central inference whose envs step in groups, one ``RolloutEngine`` per group in an
  :class:`~acollect._rollout.groups.EngineGroups`.

The in-process :class:`~acollect.Collector` and every worker process call it, so an env or a policy is checked,
placed and wrapped the same way wherever it runs, an option that does not apply to coroutine envs is refused in
one place, and whatever was built is closed if anything after it fails.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, Literal, TypeVar, overload

from acollect._batches.plan import BatchPlan
from acollect._devices import Devices
from acollect._policy import PolicyAdapter, build_policy
from acollect._rollout.blocking import RolloutEngine
from acollect._rollout.coroutines import AsyncRollout
from acollect._rollout.engine import BlockingEngine, Engine
from acollect._rollout.env_faults import EnvFaults, check_env_errors, env_faults_for
from acollect._rollout.groups import EngineGroups
from acollect._rollout.own_loop import LoopRollout
from acollect._rollout.spec import RolloutSpec
from acollect._weights.updates import PolicyWeights
from acollect.envs import AsyncEnvPool, EnvBase, make_env
from acollect.errors import ConfigurationError

__all__ = ["build_engine"]

_E = TypeVar("_E")
_A = TypeVar("_A")
#: builds the engine that owns an env and a policy adapter, once both are built
_Make = Callable[[EnvBase, PolicyAdapter, Devices], _E]


@overload
def build_engine(
    spec: RolloutSpec, *, blocking: Literal[False], weights: PolicyWeights | None = None
) -> RolloutEngine | AsyncRollout: ...


@overload
def build_engine(
    spec: RolloutSpec,
    *,
    blocking: Literal[True],
    remote_policy: Callable[[int], PolicyAdapter] | None = None,
    env_groups: int = 1,
    require_groups: bool = False,
) -> BlockingEngine: ...


def build_engine(
    spec: RolloutSpec,
    *,
    blocking: bool,
    weights: PolicyWeights | None = None,
    remote_policy: Callable[[int], PolicyAdapter] | None = None,
    env_groups: int = 1,
    require_groups: bool = False,
) -> Engine:
    """Builds the env, the policy, the devices and the engine that drives them.

    Args:
        spec: what to build.
        blocking: whether blocking code drives the engine (a worker process): coroutine envs then step on an
            event loop of the engine's own (:class:`~acollect._rollout.own_loop.LoopRollout`). ``False``: the caller
            runs an event loop (the in-process collector), and coroutine envs step on it as tasks.
        weights: weights staged by the caller, which coroutine envs' engine applies between its policy passes
            (``blocking=False`` only; a blocking engine's caller applies them between batches).
        remote_policy: central inference (``blocking=True`` only): builds the policy of env group ``g``, a client
            of the inference server whose calls split in two, in place of ``spec.policy`` and its factory.
        env_groups: central inference (with ``remote_policy``): the envs are built as this many groups (at most
            one per env, ``env_kwargs["num_envs"]`` shared out among them), each stepping while the others wait
            for their actions. Applies where ``num_envs >= 2`` and ``init_random_frames`` is 0; coroutine envs are
            never split, their envs stepping while the others wait already.
        require_groups: ``env_groups`` was asked for by name: where it cannot apply (coroutine envs), say so
            instead of stepping one group.

    Returns:
        The engine. It owns the env and the policy adapter: its ``close()`` (``aclose()`` for an ``AsyncRollout``)
        closes them.

    Raises:
        ConfigurationError: ``reset_at_each_iter`` with coroutine envs, an env given built with
            ``env_errors="restart"``, or the env or the policy would not do.

    Examples:
        >>> from acollect.testing import CountingEnv
        >>> from acollect._rollout.spec import RolloutSpec
        >>> spec = RolloutSpec(create_env_fn=CountingEnv, env_kwargs={"num_envs": 2}, frames_per_batch=8)
        >>> engine = build_engine(spec, blocking=True)
        >>> type(engine).__name__, engine.collect().batch_size
        ('RolloutEngine', torch.Size([2, 4]))
        >>> engine.close()
    """
    if blocking:
        return _blocking_engine(spec, remote_policy, env_groups, require_groups)
    return _owning(spec, None, lambda: spec.policy, functools.partial(_engine, spec, weights, lambda rollout: rollout))


def _blocking_engine(
    spec: RolloutSpec, remote_policy: Callable[[int], PolicyAdapter] | None, env_groups: int, require_groups: bool
) -> BlockingEngine:
    if remote_policy is None:
        return _owning(spec, None, lambda: spec.policy, functools.partial(_engine, spec, None, LoopRollout))
    spec = replace(spec, policy=None, policy_factory=None)  # the inference server runs the policy
    sizes = _group_sizes(spec, env_groups)
    if sizes is not None:
        first = make_env(spec.create_env_fn, **{**spec.env_kwargs, "num_envs": sizes[0]})
        if not isinstance(first, AsyncEnvPool):
            return _groups(spec, sizes, first, remote_policy)
        # Coroutine envs are one group: each already steps while the others wait for their actions.
        first.close()
        if require_groups:
            raise ConfigurationError.bad_value(
                "env_groups",
                env_groups,
                "None or 1 with coroutine envs (AsyncEnvPool): each of their envs already "
                "steps while the others wait for their actions, so they are never split into groups",
            )
    return _owning(spec, None, functools.partial(remote_policy, 0), functools.partial(_engine, spec, None, LoopRollout))


def _group_sizes(spec: RolloutSpec, wanted: int) -> list[int] | None:
    """The sizes of the env groups, as even as can be (``None``: one group)."""
    n_envs = spec.env_kwargs.get("num_envs")
    if type(wanted) is not int or wanted < 2 or spec.init_random_frames:
        return None
    if type(n_envs) is not int or n_envs < 2:
        return None
    count = min(wanted, n_envs)
    return [n_envs // count + (1 if g < n_envs % count else 0) for g in range(count)]


def _groups(
    spec: RolloutSpec, sizes: list[int], first: EnvBase, remote_policy: Callable[[int], PolicyAdapter]
) -> EngineGroups:
    # Each group takes as many steps per batch as one env of num_envs would: the batch is theirs side by side.
    steps = BatchPlan(spec.frames_per_batch).time_steps(sum(sizes))
    with ExitStack() as undo:
        engines: list[RolloutEngine] = []
        for g, n_envs in enumerate(sizes):
            # Trajectory ids: group g of a worker with offset k and stride n takes offset k + g * n, stride G * n.
            part = replace(
                spec,
                env_kwargs={**spec.env_kwargs, "num_envs": n_envs},
                traj_id_offset=spec.traj_id_offset + g * spec.traj_id_stride,
                traj_id_stride=len(sizes) * spec.traj_id_stride,
            )
            env = first if g == 0 else None
            engine = _owning(
                part,
                env,
                functools.partial(remote_policy, g),
                functools.partial(_rollout_engine, part, time_steps=steps),
            )
            undo.callback(engine.close)
            engines.append(engine)
        groups = EngineGroups(engines)
        undo.pop_all()
    return groups


def _owning(spec: RolloutSpec, env: EnvBase | None, make_policy: Callable[[], Any], make: _Make[_E]) -> _E:
    """Builds the env (unless given), the policy and, with ``make``, the engine that owns both.

    Whatever was built (or given) is closed if anything fails.
    """
    check_env_errors(spec.create_env_fn, spec.env_errors)
    with ExitStack() as undo:
        if env is None:
            env = make_env(spec.create_env_fn, **spec.env_kwargs)
        undo.callback(env.close)
        if isinstance(env, AsyncEnvPool) and spec.reset_at_each_iter:
            raise ConfigurationError.bad_value(
                "reset_at_each_iter",
                True,
                "False with an AsyncEnvPool (its envs run ahead into the next batch: call set_seed() to start afresh)",
            )
        policy = make_policy()
        if isinstance(policy, PolicyAdapter):  # a central inference client holds a connection
            undo.callback(policy.close)
        if isinstance(spec.policy_factory, str):  # resolved by a worker before it builds; refused in-process
            raise ConfigurationError.bad_value("policy_factory", spec.policy_factory, "a callable, here")
        adapter, devices = build_policy(env, policy=policy, policy_factory=spec.policy_factory, devices=spec.devices)
        if adapter is not policy:
            undo.callback(adapter.close)
        engine = make(env, adapter, devices)
        undo.pop_all()
    return engine


def _rollout_engine(
    spec: RolloutSpec, env: EnvBase, adapter: PolicyAdapter, devices: Devices, *, time_steps: int | None = None
) -> RolloutEngine:
    """``time_steps``: settled already (a group of a worker's envs); ``None``: asked of the plan, now that the env
    says its number of envs."""
    return RolloutEngine(
        env,
        adapter,
        time_steps=time_steps if time_steps is not None else BatchPlan(spec.frames_per_batch).time_steps(env.num_envs),
        devices=devices,
        spec=spec,
        env_faults=env_faults_for(spec.create_env_fn, dict(spec.env_kwargs), spec.env_errors),
    )


def _engine(
    spec: RolloutSpec,
    weights: PolicyWeights | None,
    wrap: Callable[[AsyncRollout], _A],
    env: EnvBase,
    adapter: PolicyAdapter,
    devices: Devices,
) -> RolloutEngine | _A:
    """The engine that drives ``env``; coroutine envs' goes through ``wrap``: kept as is for a caller with an event
    loop (they step on it), a :class:`LoopRollout` for blocking code (they step on an event loop of its own)."""
    if isinstance(env, AsyncEnvPool):
        rollout = AsyncRollout(
            env,
            adapter,
            time_steps=BatchPlan(spec.frames_per_batch).time_steps(env.num_envs),
            devices=devices,
            spec=spec,
            weights=weights,
            # Each coroutine env is rebuilt alone, by its pool (the pool's own factory builds one env).
            env_faults=EnvFaults() if spec.env_errors == "restart" else None,
        )
        return wrap(rollout)
    return _rollout_engine(spec, env, adapter, devices)
