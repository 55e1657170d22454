"""The rollout engine for coroutine envs: every env a task on the event loop, the policy over those waiting.

:class:`AsyncRollout` is what the in-process :class:`~acollect.Collector` runs
in place of :class:`~acollect.rollout.RolloutEngine` when its env is an
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
a slower one runs in a thread (:func:`acollect._threads.run_in_thread`).

**Rows.** Row ``i`` of a batch is env ``i``'s ``T`` consecutive steps, and an
env whose row of the current batch is full goes on in its row of the next one
(:class:`acollect._row_ring.RowRing`): no env idles at a batch boundary, and
memory stays bounded at two batches.

**Versions.** Weights apply between passes; every frame carries the version
of the weights that chose its action (``("collector", "policy_version")``), so
a batch may hold two versions around a weight push.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType

from acollect._row_ring import RowRing
from acollect._threads import run_in_thread
from acollect.devices import Devices
from acollect.envs.async_pool import AsyncEnvPool
from acollect.errors import PolicyError
from acollect.policy import ModulePolicy, NestedKey, PolicyAdapter, RandomPolicy
from acollect.rollout import exploration, frames_per_batch_for

__all__ = ["INLINE_POLICY_SECONDS", "AsyncRollout"]

#: a policy pass on every env taking longer than this runs in a thread, not on the event loop
INLINE_POLICY_SECONDS = 1e-3
_COLLECTOR = "collector"
_SETTLE_TIMEOUT = 30.0
_TIMED_PROBES = 5

Spawn = Callable[..., anyio.CancelScope]


class AsyncRollout:
    """Fills ``[n_envs, T]`` batches from an :class:`AsyncEnvPool`, stepping every env as a task.

    Args:
        env: the pool (it belongs to the engine from now on).
        policy: the policy adapter (see :func:`acollect.policy.wrap_policy`).
        frames_per_batch: frames per batch; rounded up to a multiple of ``env.num_envs``.
        devices: env, policy and storing devices.
        max_frames_per_traj: truncate (and reset) trajectories longer than this.
        init_random_frames: act randomly until this many frames were stepped.
        exploration_type: tensordict interaction type set while the policy runs.
        weights: staged weights (``acollect.weights.PolicyWeights``), applied between passes.
        traj_id_offset: first trajectory id; with ``traj_id_stride`` it makes ids unique across workers.
        traj_id_stride: step between consecutive trajectory ids.

    Examples:
        >>> import anyio
        >>> from acollect._tasks import TaskOwner
        >>> from acollect.devices import resolve_devices
        >>> from acollect.envs import AsyncEnvPool
        >>> from acollect.policy import RandomPolicy
        >>> from acollect.testing import AsyncCountingEnv
        >>> async def main():
        ...     pool = AsyncEnvPool(AsyncCountingEnv, num_envs=2)
        ...     engine = AsyncRollout(pool, RandomPolicy(pool.action_spec, (2,)), frames_per_batch=8,
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
        frames_per_batch: int,
        devices: Devices,
        max_frames_per_traj: int | None = None,
        init_random_frames: int = 0,
        exploration_type: InteractionType | None = InteractionType.RANDOM,
        weights: Any = None,
        traj_id_offset: int = 0,
        traj_id_stride: int = 1,
    ) -> None:
        self.env, self.policy, self.devices = env, policy, devices
        self.n_envs = env.num_envs
        self.frames_per_batch = frames_per_batch_for(frames_per_batch, self.n_envs)
        self.time_steps = self.frames_per_batch // self.n_envs
        self.max_frames_per_traj = max_frames_per_traj
        self.init_random_frames = init_random_frames
        self.exploration_type = exploration_type
        self.weights = weights
        #: frames handed out; env steps taken; frames stepped and then given up by a reseed or restore
        self.frames, self.steps, self.discarded_frames = 0, 0, 0
        #: the version of the weights the next pass runs with
        self.policy_version = 0
        #: True while a pass runs in a thread: weights staged meanwhile wait for the next pass
        self.in_batch = False
        #: whether passes run in a thread (decided by timing the first passes)
        self.policy_in_thread = False
        self._next_traj_counter = 0
        self._traj_id_offset, self._traj_id_stride = traj_id_offset, traj_id_stride
        self._generator = torch.Generator()
        self._seed: int | None = None
        self._needs_restart = True
        n = self.n_envs
        self._root = env.make_root()
        self._obs_keys: list[tuple[str, ...]] = [leaf.key for leaf in env.leaves]  # the order the env writes
        self._root_np = [self._root.get(leaf.key).numpy() for leaf in env.leaves]
        self._extra_inputs = not isinstance(policy, (ModulePolicy, RandomPolicy))
        self._out_specs: dict[NestedKey, tuple[torch.Size, torch.dtype]] | None = None
        self._traj_ids = np.zeros(n, dtype=np.int64)
        self._traj_steps = np.zeros(n, dtype=np.int64)
        self._ring = RowRing(n, self.time_steps)
        self._ready: list[int] = []
        self._actions: list[Any] = [None] * n
        self._go = [anyio.Event() for _ in range(n)]
        self._wake = anyio.Event()
        self._in_flight = 0
        self._settled = anyio.Event()
        self._paused = False
        self._failure: BaseException | None = None
        self._group_scope: anyio.CancelScope | None = None
        self._runner_scope: anyio.CancelScope | None = None
        self._runner_done = anyio.Event()
        self._runner_done.set()
        self._allocated = False

    # -- state (the Collector's state dicts and seeds) ---------------------------------------
    @property
    def next_traj_counter(self) -> int:
        """How many trajectory ids were handed out."""
        return self._next_traj_counter

    @next_traj_counter.setter
    def next_traj_counter(self, value: int) -> None:
        self._next_traj_counter = int(value)

    def seed(self, seed: int) -> None:
        """Env ``i`` is reset with ``seed + i`` before the next batch, which starts afresh."""
        self._seed = seed
        self._generator.manual_seed(seed)
        self.restart()

    def restart(self) -> None:
        """The next batch starts from a fresh reset of every env; the steps taken ahead are given up."""
        self._needs_restart = True

    def _new_traj_id(self) -> int:
        self._next_traj_counter += 1
        return self._traj_id_offset + self._traj_id_stride * (self._next_traj_counter - 1)

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
        if not self._needs_restart:
            return
        await self._stop_runner()
        if self._allocated:  # steps taken into batches nobody will see
            self.discarded_frames += self._ring.stepped
        seed, self._seed = self._seed, None
        obs = await self._reset_all(seed)
        for i, one in enumerate(obs):
            self.env.checker.write_obs(i, "reset", one, self._root_np, i)
        self._traj_ids[:] = [self._new_traj_id() for _ in range(self.n_envs)]
        self._traj_steps[:] = 0
        if self._out_specs is None:
            self._probe()
        assert self._out_specs is not None
        spec = self.env.observation_spec
        self._ring.allocate({k: (spec[k].shape, spec[k].dtype) for k in self._obs_keys},
                            (self.env.reward_spec.shape, self.env.reward_spec.dtype), self._out_specs)  # fmt: skip
        self._allocated = True
        self._ready = list(range(self.n_envs))
        self._go = [anyio.Event() for _ in range(self.n_envs)]
        self._wake, self._in_flight = anyio.Event(), 0
        self._wake.set()
        self._failure = None
        self._runner_done = anyio.Event()
        self._needs_restart = False
        self._runner_scope = spawn(self._run, name="async-envs")

    async def _reset_all(self, seed: int | None) -> list[Any]:
        """Resets every env concurrently; the first failure cancels the others and is raised as it is."""
        obs: list[Any] = [None] * self.n_envs
        failures: list[BaseException] = []

        async def reset_one(i: int, scope: anyio.CancelScope) -> None:
            try:
                obs[i] = await self.env.call_reset(i, None if seed is None else seed + i)
            except Exception as exc:
                failures.append(exc)
                scope.cancel()

        async with anyio.create_task_group() as tg:
            for i in range(self.n_envs):
                tg.start_soon(reset_one, i, tg.cancel_scope)
        if failures:
            raise failures[0]
        return obs

    async def _stop_runner(self) -> None:
        if self._runner_scope is not None:
            self._runner_scope.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_SETTLE_TIMEOUT):
                await self._runner_done.wait()
            self._runner_scope = None

    async def aclose(self) -> None:
        """Stops every env task, awaits every env's ``aclose()`` (each under a deadline), closes the policy."""
        with anyio.CancelScope(shield=True):
            await self._stop_runner()
            await self.env.aclose_envs()
        self.env.close()
        self.policy.close()

    async def set_paused(self, paused: bool) -> None:
        """Stops choosing actions (and waits for the steps in flight to end), or goes on."""
        self._paused = paused
        if not paused:
            self._wake.set()
            return
        self._settled = anyio.Event()
        if self._in_flight and self._runner_scope is not None:
            with anyio.move_on_after(self.env.step_timeout or _SETTLE_TIMEOUT):
                await self._settled.wait()

    # -- the batch -------------------------------------------------------------------------------
    async def collect(self, spawn: Spawn) -> TensorDict:
        """Waits until every env's row of the current batch is full; hands the batch out.

        Cancelling it loses nothing: the envs go on filling this batch and their rows of the next one.
        """
        await self.ensure_running(spawn)
        await self._ring.ready.wait()
        batch, released = self._ring.hand_out()
        self._ready.extend(released)  # their next row just became free
        self._wake.set()
        self.frames += self.frames_per_batch
        if self.devices.storing.type != "cpu":
            batch = batch.to(self.devices.storing)
        batch.names = [None, "time"]
        return batch

    # -- the tasks ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._group_scope = tg.cancel_scope
                for i in range(self.n_envs):
                    tg.start_soon(self._guarded, self._env_loop, i, name=f"async-env-{i}")
                tg.start_soon(self._guarded, self._policy_loop, None, name="async-env-policy")
        finally:
            self._group_scope = None
            self._runner_done.set()
        if self._failure is not None:
            raise self._failure  # to the collector's task owner: the collector is BROKEN now

    async def _guarded(self, loop: Callable[..., Any], arg: Any) -> None:
        try:
            await (loop(arg) if arg is not None else loop())
        except Exception as exc:  # the first failure ends every env's task (cancellation passes through)
            if self._failure is None:
                self._failure = exc
            if self._group_scope is not None:
                self._group_scope.cancel()

    async def _env_loop(self, i: int) -> None:
        pool, checker, views = self.env, self.env.checker, self._ring.views
        reward, terminated, truncated, done = views["reward"], views["terminated"], views["truncated"], views["done"]
        next_obs, root = views["next_obs"], self._root_np
        max_traj = self.max_frames_per_traj
        while True:
            await self._go[i].wait()
            col = int(self._ring.cols[i])
            obs, r, term, trunc = checker.split_step(i, await pool.call_step(i, self._actions[i]))
            checker.write_obs(i, "step", obs, next_obs, (i, col))
            self.steps += 1
            steps = self._traj_steps[i] + 1
            if max_traj is not None and steps >= max_traj:
                trunc = trunc or not term
            reward[i, col], terminated[i, col], truncated[i, col], done[i, col] = r, term, trunc, term or trunc
            if term or trunc:
                obs = await pool.call_reset(i)
                self._traj_ids[i] = self._new_traj_id()
                steps = 0
            checker.write_obs(i, "reset" if steps == 0 else "step", obs, root, i)
            self._traj_steps[i] = steps
            self._advance(i)

    def _advance(self, i: int) -> None:
        self._go[i] = anyio.Event()  # a parked env waits on it too, until the batch is handed out
        if self._ring.advance(i):
            self._ready.append(i)
            self._wake.set()
        self._in_flight -= 1
        if self._in_flight == 0 and self._paused:
            self._settled.set()

    async def _policy_loop(self) -> None:
        while True:
            if not self._ready or self._paused:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            await anyio.lowlevel.checkpoint()  # envs whose steps ended in this same loop turn join the pass
            if self._paused:
                continue
            idx, self._ready = self._ready, []
            await self._pass(idx)

    # -- a policy pass -------------------------------------------------------------------------------
    def _inputs(self, rows: np.ndarray | None) -> TensorDict:
        k = self.n_envs if rows is None else len(rows)
        td = TensorDict({}, batch_size=(k,))
        for key, arr in zip(self._obs_keys, self._root_np, strict=True):
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

    def _probe(self) -> None:
        """Runs the policy on every env: checks its outputs, and times it to choose where it runs.

        The fastest of a few timed passes decides: a pass slowed down by another process on a busy
        machine must not send a small policy to a thread.
        """
        td = self._inputs(None)
        outputs = self._forward(td)
        self._check_outputs(outputs)
        fastest = float("inf")
        for _ in range(_TIMED_PROBES):
            start = time.perf_counter()
            self._forward(td)
            fastest = min(fastest, time.perf_counter() - start)
            if fastest <= INLINE_POLICY_SECONDS:
                break
        self.policy_in_thread = fastest > INLINE_POLICY_SECONDS
        self._out_specs = {k: (v.shape[1:], v.dtype) for k, v in outputs.items()}

    def _check_outputs(self, outputs: dict[NestedKey, torch.Tensor]) -> None:
        if "action" not in outputs:
            raise PolicyError(f"the policy did not write 'action' (it wrote {sorted(map(str, outputs))})")
        expected = (self.n_envs, *self.env.action_spec.shape)
        if tuple(outputs["action"].shape) != expected:
            raise PolicyError(f"the policy wrote an 'action' of shape {tuple(outputs['action'].shape)}: expected "
                              f"{expected} ([n_envs, *action_spec.shape] for {self.env.action_spec})")  # fmt: skip
        for key, value in outputs.items():
            if value.shape[:1] != (self.n_envs,):
                raise PolicyError(f"the policy wrote {key!r} of shape {tuple(value.shape)}: expected a leading "
                                  f"batch dim of {self.n_envs}")  # fmt: skip

    async def _pass(self, idx: list[int]) -> None:
        rows = np.asarray(idx, dtype=np.int64)
        k = len(idx)
        cols = self._ring.place(rows)
        if self.weights is not None:
            self.weights.apply_pending(self)
        version = self.policy_version
        if self.steps < self.init_random_frames or isinstance(self.policy, RandomPolicy):
            outputs: dict[NestedKey, torch.Tensor] = {"action": self.env.action_spec.rand((k,), self._generator)}
        elif self.policy_in_thread:
            td = self._inputs(rows)
            self.in_batch = True
            try:
                outputs = await run_in_thread(lambda _stop: self._forward(td), name="async-env-policy")
            finally:
                self.in_batch = False
        else:
            outputs = self._forward(self._inputs(rows))
        views = self._ring.views
        for key, buffer in views["outputs"]:
            value = outputs.get(key)
            if value is None or value.shape[:1] != (k,):
                raise PolicyError(f"the policy wrote {key!r} of shape {None if value is None else tuple(value.shape)} "
                                  f"on {k} envs: expected a leading batch dim of {k}")  # fmt: skip
            buffer[rows, cols] = value.detach().cpu().numpy()
        for buffer, root in zip(views["obs"], self._root_np, strict=True):
            buffer[rows, cols] = root[rows]
        views["traj"][rows, cols] = self._traj_ids[rows]
        views["version"][rows, cols] = version
        actions = outputs["action"].detach().cpu().numpy()
        given = actions.tolist() if self.env.int_actions else list(actions.copy())
        self._in_flight += k
        for i, action in zip(idx, given, strict=True):
            self._actions[i] = action
            self._go[i].set()
