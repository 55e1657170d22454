"""The policy task of the coroutine-env engine: a pass over the envs waiting, as soon as one waits.

:meth:`PolicyPasses.run` takes the envs waiting for an action (the batching rule of
:mod:`acollect._rollout.coroutines`), runs the policy on their observations, writes what each step starts from into its
row (observations, the policy's outputs, trajectory id, weights version) and hands each env its action.

Where the policy runs is decided once, by timing it on every env (the fastest of a few passes): a pass that takes
under :data:`INLINE_POLICY_SECONDS` runs inline on the loop, a slower one in a thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch
from tensordict import TensorDict

from acollect._devices import Devices
from acollect._policy import (
    ModulePolicy,
    NestedKey,
    PolicyAdapter,
    RandomPolicy,
    check_policy_outputs,
    unseeded_generator,
)
from acollect._rollout.blocking import exploration
from acollect._rollout.env_steps import EnvSteps
from acollect._rollout.env_turns import EnvTurns
from acollect._rollout.row_ring import RowRing
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.threads import run_in_thread
from acollect.errors import PolicyError

__all__ = ["INLINE_POLICY_SECONDS", "OutputLayout", "PolicyPasses"]

logger = logging.getLogger("acollect")

#: a policy pass on every env taking longer than this runs in a thread, not on the event loop
INLINE_POLICY_SECONDS = 1e-3
_TIMED_PROBES = 5

#: the policy's outputs: key -> (the shape of one env's, dtype)
OutputLayout = dict[NestedKey, tuple[torch.Size, torch.dtype]]


class PolicyPasses:
    """Chooses the actions of the envs waiting, a pass at a time.

    Args:
        envs: the env tasks (their observations, trajectories and steps so far).
        ring: the rows a pass writes into.
        turns: where the envs waiting are taken from and their actions handed to.
        policy: the policy adapter.
        devices: env, policy and storing devices.
        spec: the rollout options: its ``exploration_type`` is set while the policy runs, and it acts randomly
            until ``init_random_frames`` env steps were taken.
        before_pass: called before each pass (it applies staged weights); returns the version of the weights the
            pass runs with.

    Attributes:
        generator: the random actions' generator (seeded with the envs).
        in_thread: whether passes run in a thread (decided by :meth:`output_layout`'s probe).
        running_in_thread: whether a pass runs in a thread now (weights staged meanwhile wait for the next pass).
    """

    def __init__(
        self,
        envs: EnvSteps,
        ring: RowRing,
        turns: EnvTurns,
        policy: PolicyAdapter,
        *,
        devices: Devices,
        spec: RolloutSpec,
        before_pass: Callable[[], int],
    ) -> None:
        self.envs, self.ring, self.turns, self.policy = envs, ring, turns, policy
        self.devices = devices
        self.exploration_type = spec.exploration_type
        self.init_random_frames = spec.init_random_frames
        self._before_pass = before_pass
        self.generator = unseeded_generator()  # a fixed default seed would repeat in every worker
        self.in_thread = False
        self.running_in_thread = False
        self._extra_inputs = not isinstance(policy, (ModulePolicy, RandomPolicy))  # it may read the done flags
        self._layout: OutputLayout | None = None

    async def run(self) -> None:
        """The policy task: forever, a pass over the envs waiting."""
        while True:
            await self._pass(await self.turns.waiting())

    def output_layout(self) -> OutputLayout:
        """The policy's outputs; the first call probes the policy on every env (their observations are set)."""
        if self._layout is None:
            self._layout = self._probe()
        return self._layout

    # -- calling the policy ------------------------------------------------------------------------
    def _inputs(self, rows: np.ndarray | None) -> TensorDict:
        """The policy's input: the observations of ``rows`` (``None``: every env)."""
        k = self.envs.pool.num_envs if rows is None else len(rows)
        td = TensorDict({}, batch_size=(k,))
        for key, arr in zip(self.envs.obs_keys, self.envs.root_np, strict=True):
            td.set(key, torch.from_numpy(arr.copy() if rows is None else arr[rows]))
        if self._extra_inputs:
            for flag in ("done", "terminated", "truncated"):
                td.set(flag, torch.zeros((k, 1), dtype=torch.bool))
        if not self.devices.policy_is_env:
            td = td.to(self.devices.policy)
        return td

    def _forward(self, td: TensorDict) -> dict[NestedKey, torch.Tensor]:
        with torch.inference_mode(), exploration(self.exploration_type):
            return self.policy(td)

    def _probe(self) -> OutputLayout:
        """Runs the policy on every env: checks its outputs, and times it to choose where it runs.

        The fastest of a few timed passes decides: a pass slowed down by another process on a busy
        machine must not send a small policy to a thread.
        """
        td = self._inputs(None)
        outputs = self._forward(td)
        check_policy_outputs(outputs, self.envs.pool.num_envs, self.envs.pool.action_spec)  # as every engine
        fastest = float("inf")
        for _ in range(_TIMED_PROBES):
            start = time.perf_counter()
            self._forward(td)
            fastest = min(fastest, time.perf_counter() - start)
            if fastest <= INLINE_POLICY_SECONDS:
                break
        self.in_thread = fastest > INLINE_POLICY_SECONDS
        logger.debug(
            "coroutine envs: the policy's passes run %s (the fastest of the probe passes took %.3f ms)",
            "in a thread" if self.in_thread else "inline on the event loop",
            1000 * fastest,
        )
        return {k: (v.shape[1:], v.dtype) for k, v in outputs.items()}

    # -- a pass ---------------------------------------------------------------------------------------
    async def _pass(self, idx: list[int]) -> None:
        envs, pool = self.envs, self.envs.pool
        rows = np.asarray(idx, dtype=np.int64)
        k = len(idx)
        cols = self.ring.place(rows)
        version = self._before_pass()
        if envs.steps < self.init_random_frames or isinstance(self.policy, RandomPolicy):
            outputs: dict[NestedKey, torch.Tensor] = {"action": pool.action_spec.rand((k,), self.generator)}
        elif self.in_thread:
            td = self._inputs(rows)
            self.running_in_thread = True
            try:
                outputs = await run_in_thread(lambda _stop: self._forward(td), name="async-env-policy")
            finally:
                self.running_in_thread = False
        else:
            outputs = self._forward(self._inputs(rows))
        views = self.ring.views
        for key, buffer in views["outputs"]:
            value = outputs.get(key)
            if value is None or value.shape[:1] != (k,):
                raise PolicyError(
                    f"the policy wrote {key!r} of shape {None if value is None else tuple(value.shape)} "
                    f"on {k} envs: expected a leading batch dim of {k}"
                )
            buffer[rows, cols] = value.detach().cpu().numpy()
        for buffer, root in zip(views["obs"], envs.root_np, strict=True):
            buffer[rows, cols] = root[rows]
        views["traj"][rows, cols] = envs.trajectories.ids[rows]
        views["version"][rows, cols] = version
        actions = outputs["action"].detach().cpu().numpy()
        self.turns.give(idx, actions.tolist() if pool.int_actions else list(actions.copy()))
