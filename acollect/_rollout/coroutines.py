"""The rollout engine for coroutine envs: every env a task on the event loop, the policy over those waiting.

:class:`AsyncRollout` is what the in-process :class:`~acollect.Collector` runs
in place of :class:`~acollect._rollout.blocking.RolloutEngine` when its env is an
:class:`~acollect.envs.AsyncEnvPool`. Nothing runs in a thread (unless the
policy is big, see below): each env is a task that waits for its action, awaits
its ``step`` (and its ``reset`` when the episode ended, in the same step),
writes the result and waits again. One more task, the *policy task*, chooses
the actions.

**Batching rule.** The policy task runs a pass as soon as at least one env
waits and the previous pass is over; after one yield to the loop (so envs
whose steps ended in the same loop turn join), the pass takes *every* env
waiting at that moment. No pass ever waits for a particular env, so a slow env
never holds a fast one back, and the size of a pass follows the load: while a
pass runs, the envs that finish meanwhile queue up for the next one.

**Where the policy runs.** A pass on all envs is timed at start (the fastest of a
few): a pass that takes under :data:`INLINE_POLICY_SECONDS` runs inline on the loop
(cheaper than a thread hop, and short enough to keep the loop's lag low);
a slower one runs in a thread (:func:`acollect._runtime.threads.run_in_thread`).

**Rows.** Row ``i`` of a batch is env ``i``'s ``T`` consecutive steps, and an
env whose row of the current batch is full goes on in its row of the next one
(:class:`acollect._rollout.row_ring.RowRing`): no env idles at a batch boundary, and
memory stays bounded at two batches.

**Versions.** Weights apply between passes; every frame carries the version
of the weights that chose its action (``("collector", "policy_version")``), so
a batch may hold two versions around a weight push.

**Parts.** :class:`AsyncRollout` holds the counters and the batch, and starts and
stops the rest: the env tasks (:class:`acollect._rollout.env_steps.EnvSteps`), the policy
task (:class:`acollect._rollout.policy_passes.PolicyPasses`), and the hand-over between
them, which a pause holds (:class:`acollect._rollout.env_turns.EnvTurns`); those tasks
stand or fall together (:class:`TaskCrew`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from tensordict import TensorDict

from acollect._devices import Devices
from acollect._policy import PolicyAdapter
from acollect._rollout.blocking import Reset
from acollect._rollout.env_faults import EnvFaults
from acollect._rollout.env_steps import EnvSteps
from acollect._rollout.env_turns import EnvTurns
from acollect._rollout.policy_passes import INLINE_POLICY_SECONDS, PolicyPasses
from acollect._rollout.row_ring import RowRing
from acollect._rollout.spec import RolloutSpec
from acollect._weights.updates import PolicyWeights
from acollect.envs import AsyncEnvPool

__all__ = ["INLINE_POLICY_SECONDS", "AsyncRollout", "TaskCrew"]

_SETTLE_TIMEOUT = 30.0

Spawn = Callable[..., anyio.CancelScope]


class TaskCrew:
    """Tasks that stand or fall together: the first that fails cancels the others.

    Its exception is then raised to whoever spawned the crew (the collector's task owner: the collector is
    BROKEN). Cancellation passes through.

    Examples:
        >>> import anyio
        >>> from acollect._runtime.tasks import TaskOwner
        >>> async def main():
        ...     failures, stopped = [], []
        ...     owner = TaskOwner("doc", on_failure=failures.append)
        ...     owner.ensure_group()
        ...     async def waits():
        ...         try:
        ...             await anyio.sleep_forever()
        ...         finally:
        ...             stopped.append("waits")
        ...     async def fails():
        ...         raise RuntimeError("boom")
        ...     crew = TaskCrew()
        ...     crew.start(owner.spawn, [(waits, "waits"), (fails, "fails")], name="doc-crew")
        ...     await anyio.sleep(0.05)
        ...     await crew.stop()
        ...     await owner.aclose(1.0)
        ...     return [str(f) for f in failures], stopped, crew.running
        >>> anyio.run(main)
        (['boom'], ['waits'], False)
    """

    def __init__(self) -> None:
        self._scope: anyio.CancelScope | None = None  # the spawned crew's: stop() cancels it
        self._group: anyio.CancelScope | None = None  # the crew's task group: the first failure cancels it
        self._failure: BaseException | None = None
        self._done = anyio.Event()
        self._done.set()

    @property
    def running(self) -> bool:
        """Whether the crew was started and not stopped (it may have ended by a failure meanwhile)."""
        return self._scope is not None

    def start(self, spawn: Spawn, tasks: Sequence[tuple[Callable[[], Awaitable[Any]], str]], *, name: str) -> None:
        """Runs each ``(coroutine function, name)`` of ``tasks`` in one task group, spawned with ``spawn``."""
        self._failure = None
        self._done = anyio.Event()
        self._scope = spawn(self._run, tasks, name=name)

    async def stop(self) -> None:
        """Cancels every task and waits (shielded, for a bounded time) until they are gone."""
        if self._scope is not None:
            self._scope.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_SETTLE_TIMEOUT):
                await self._done.wait()
            self._scope = None

    async def _run(self, tasks: Sequence[tuple[Callable[[], Awaitable[Any]], str]]) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._group = tg.cancel_scope
                for fn, task_name in tasks:
                    tg.start_soon(self._guarded, fn, name=task_name)
        finally:
            self._group = None
            self._done.set()
        if self._failure is not None:
            raise self._failure

    async def _guarded(self, fn: Callable[[], Awaitable[Any]]) -> None:
        try:
            await fn()
        except Exception as exc:  # the first failure ends every task (cancellation passes through)
            if self._failure is None:
                self._failure = exc
            if self._group is not None:
                self._group.cancel()


class AsyncRollout:
    """Fills ``[n_envs, T]`` batches from an :class:`AsyncEnvPool`, stepping every env as a task.

    Args:
        env: the pool (it belongs to the engine from now on).
        policy: the policy adapter (see :func:`acollect._policy.wrap_policy`).
        time_steps: the steps each env takes per batch, as the batch-size plan settled them
            (:meth:`~acollect._batches.plan.BatchPlan.time_steps`): a batch holds ``n_envs * time_steps`` frames.
        devices: env, policy and storing devices.
        spec: the rollout options this engine reads (its env steps and policy passes read theirs), as the collector
            made them (:class:`~acollect._rollout.spec.RolloutSpec`); ``None``: every default.
        weights: staged weights, applied between passes.
        env_faults: where an exception of an env's ``step`` or ``reset`` goes (``env_errors="restart"``): that env
            alone is rebuilt by the pool and reset, its episode in flight ending as truncated at its last step
            recorded (:mod:`acollect._rollout.env_faults`); ``None``: the exception is raised.

    Examples:
        >>> import anyio
        >>> from acollect._runtime.tasks import TaskOwner
        >>> from acollect._devices import resolve_devices
        >>> from acollect.envs import AsyncEnvPool
        >>> from acollect._policy import RandomPolicy
        >>> from acollect.testing import AsyncCountingEnv
        >>> async def main():
        ...     pool = AsyncEnvPool(AsyncCountingEnv, num_envs=2)
        ...     engine = AsyncRollout(pool, RandomPolicy(pool.action_spec, (2,)), time_steps=4,
        ...                           devices=resolve_devices())
        ...     tasks = TaskOwner("doc", on_failure=print)
        ...     tasks.ensure_group()
        ...     await engine.ensure_running(tasks.spawn)
        ...     batch = await engine.collect(tasks.spawn)
        ...     await engine.aclose()
        ...     await tasks.aclose(5.0)
        ...     return batch.batch_size, batch["next", "observation"][0, :, 0].tolist()
        >>> anyio.run(main)
        (torch.Size([2, 4]), [1.0, 2.0, 3.0, 4.0])
    """

    def __init__(
        self,
        env: AsyncEnvPool,
        policy: PolicyAdapter,
        *,
        time_steps: int,
        devices: Devices,
        spec: RolloutSpec | None = None,
        weights: PolicyWeights | None = None,
        env_faults: EnvFaults | None = None,
    ) -> None:
        self.env, self.policy, self.devices, self.weights = env, policy, devices, weights
        self.n_envs = env.num_envs
        self.time_steps = time_steps
        self.frames_per_batch = self.n_envs * time_steps
        #: frames handed out; frames stepped and then given up by a reseed or restore
        self.frames, self.discarded_frames = 0, 0
        #: the version of the weights the next pass runs with
        self.policy_version = 0
        # The restart due before the next batch (``None``: none): one at first.
        self._next_reset: Reset | None = Reset(seed=None)
        self._ring = RowRing(self.n_envs, self.time_steps)
        self._turns = EnvTurns(self.n_envs)
        spec = spec if spec is not None else RolloutSpec(create_env_fn=env, frames_per_batch=self.frames_per_batch)
        self._trajectories = spec.trajectories(self.n_envs)
        self._faults = env_faults
        self._envs = EnvSteps(env, self._ring, self._turns, self._trajectories, env_faults)
        self._passes = PolicyPasses(
            self._envs, self._ring, self._turns, policy, devices=devices, spec=spec, before_pass=self._before_pass
        )
        self._crew = TaskCrew()

    # -- counters and state (the Engine protocol) ------------------------------------------------
    @property
    def steps(self) -> int:
        """Env steps taken so far."""
        return self._envs.steps

    @property
    def env_restarts(self) -> int:
        """Envs rebuilt after an exception (``env_errors="restart"``: each env of the pool alone)."""
        return self._faults.restarts if self._faults is not None else 0

    @property
    def env_restarts_by_sub_env(self) -> dict[int, int]:
        """Envs of the pool rebuilt alone after they raised, by index."""
        return dict(self._faults.by_sub_env) if self._faults is not None else {}

    @property
    def in_batch(self) -> bool:
        """True while a pass runs in a thread: weights staged meanwhile wait for the next pass."""
        return self._passes.running_in_thread

    @property
    def policy_in_thread(self) -> bool:
        """Whether passes run in a thread (decided by timing the first passes)."""
        return self._passes.in_thread

    @property
    def next_traj_counter(self) -> int:
        """How many trajectory ids were handed out."""
        return self._trajectories.counter

    @next_traj_counter.setter
    def next_traj_counter(self, value: int) -> None:
        self._trajectories.counter = int(value)

    def seed(self, seed: int) -> None:
        """Env ``i`` is reset with ``seed + i`` before the next batch, which starts afresh."""
        self._next_reset = Reset(seed=seed)
        self._passes.generator.manual_seed(seed)

    def restart(self) -> None:
        """The next batch starts from a fresh reset of every env; the steps taken ahead are given up."""
        if self._next_reset is None:
            self._next_reset = Reset(seed=None)

    def _before_pass(self) -> int:
        if self.weights is not None:
            self.weights.apply_pending(self)
        return self.policy_version

    def empty_batch(self) -> TensorDict:
        """A batch of zeros with the layout :meth:`collect` hands out (after :meth:`ensure_running`)."""
        assert self._ring.buffer is not None
        batch = self._ring.buffer[:, : self.time_steps].clone().zero_()
        batch.names = [None, "time"]
        return batch

    # -- start, stop ---------------------------------------------------------------------------
    async def ensure_running(self, spawn: Spawn) -> None:
        """Resets every env (concurrently), probes the policy once, and starts the env tasks.

        Does nothing unless a restart is due (at first, after :meth:`seed` or :meth:`restart`).
        """
        reset = self._next_reset
        if reset is None:
            return
        await self._crew.stop()
        if self._ring.buffer is not None:  # steps taken into batches nobody will see
            self.discarded_frames += self._ring.stepped
        self._next_reset = Reset(seed=None)  # the seed is used once, even if this restart fails: a retry is unseeded
        await self._envs.reset_all(reset.seed)
        outputs = self._passes.output_layout()  # probed on the observations of the reset
        spec, reward = self.env.observation_spec, self.env.reward_spec
        self._ring.allocate(
            {k: (spec[k].shape, spec[k].dtype) for k in self._envs.obs_keys}, (reward.shape, reward.dtype), outputs
        )
        self._turns.start()
        self._next_reset = None
        tasks = [(functools.partial(self._envs.run, i), f"async-env-{i}") for i in range(self.n_envs)]
        self._crew.start(spawn, [*tasks, (self._passes.run, "async-env-policy")], name="async-envs")

    async def aclose(self) -> None:
        """Stops every env task, awaits every env's ``aclose()`` (each under a deadline), closes the policy."""
        with anyio.CancelScope(shield=True):
            await self._crew.stop()
            await self.env.aclose_envs()
        self.env.close()
        self.policy.close()

    async def set_paused(self, paused: bool) -> None:
        """Stops choosing actions (and waits for the steps in flight to end), or goes on."""
        if not paused:
            self._turns.resume()
            return
        self._turns.pause()
        if self._crew.running:
            await self._turns.settle(self.env.step_timeout or _SETTLE_TIMEOUT)

    # -- the batch -------------------------------------------------------------------------------
    async def collect(self, spawn: Spawn) -> TensorDict:
        """Waits until every env's row of the current batch is full; hands the batch out.

        Cancelling it loses nothing: the envs go on filling this batch and their rows of the next one.
        """
        await self.ensure_running(spawn)
        await self._ring.ready.wait()
        batch, released = self._ring.hand_out()
        self._turns.release(released)  # their next row just became free
        self.frames += self.frames_per_batch
        if self.devices.storing.type != "cpu":
            batch = batch.to(self.devices.storing)
        batch.names = [None, "time"]
        return batch
