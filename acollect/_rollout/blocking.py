"""The rollout engine of batched envs stepped by blocking code.

:class:`RolloutEngine` drives a batched env with a policy and fills preallocated ``[n_envs, T]`` buffers. It is
plain blocking code: the in-process :class:`~acollect.Collector` runs it in a thread so the event loop never
blocks, and every worker process runs the same engine (several, interleaved by :meth:`RolloutEngine.stepper`, in
a worker of central inference whose envs step in groups: :mod:`acollect._rollout.groups`). Coroutine envs have an
engine of their own (:mod:`acollect._rollout.coroutines`; in a worker, behind :mod:`acollect._rollout.own_loop`).

The hot loop allocates no TensorDict per step: the env writes into two TensorDicts allocated once (``root``: what
the next step starts from; ``next``: the result of the step), and the engine copies their leaves into per-step
views of the batch buffers.

Output layout (TorchRL's), batch dims ``[n_envs, T]`` with dim names ``[None, "time"]``:

* root: observation keys, policy outputs (``"action"``, ...), and the done flags as they stood before the step;
* ``("next", ...)``: observation keys, ``"reward"``, ``"done"``, ``"terminated"``, ``"truncated"``;
* a multi-agent env's keys where it names them (:mod:`acollect.envs._base`): its action keys among the policy
  outputs, its reward keys in place of ``"reward"``, its done flags per group (such as ``("agents", "done")``)
  beside the root ones, in root and ``"next"``;
* ``("collector", "traj_ids")``: a new id at each episode start, continuing across batches;
  ``("collector", "policy_version")``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type

from acollect._devices import Devices, move_to
from acollect._policy import (
    NestedKey,
    PolicyAdapter,
    RandomPolicy,
    SplitPolicy,
    action_outputs,
    check_policy_outputs,
)
from acollect._rollout.env_faults import EnvFaults
from acollect._rollout.keys import TransitionKeys
from acollect._rollout.spec import RolloutSpec
from acollect._rollout.sub_env_faults import ContainedFaults
from acollect._rollout.time_slices import TimeSlices, numpy_view, write_output
from acollect._time_split import ACTIONS, ENV, OTHER, POLICY, Stopwatch
from acollect.envs import DONE_KEYS, EnvBase
from acollect.errors import ConfigurationError, PolicyError
from acollect.specs import Composite

__all__ = ["Reset", "RolloutEngine", "RolloutInterrupted", "exploration"]

_COLLECTOR = "collector"


@dataclass(frozen=True)
class Reset:
    """A reset the next batch begins with, and the seed it takes (``None``: the env's own); an engine keeps the one
    due (``None``: none, the batch goes on from the last step) in place of a flag beside a seed."""

    seed: int | None


class RolloutInterrupted(Exception):  # a signal, not an error: hence no "Error" suffix
    """Raised inside :meth:`RolloutEngine.collect` when its stop event is set mid-batch.

    The steps taken so far are kept: the next :meth:`~RolloutEngine.collect` continues the same batch.
    """


@contextmanager
def exploration(kind: InteractionType | None) -> Iterator[None]:
    if kind is None:
        yield
        return
    try:
        ctx = set_interaction_type(kind, thread_local=True)
    except TypeError:  # tensordict without per-thread interaction types
        ctx = set_interaction_type(kind)
    with ctx:
        yield


class RolloutEngine:
    """Fills ``[n_envs, T]`` batches from an env and a policy.

    Args:
        env: the batched env (it belongs to the engine from now on).
        policy: the policy adapter (see :func:`acollect._policy.wrap_policy`).
        time_steps: the steps each env takes per batch, as the batch-size plan settled them
            (:meth:`~acollect._batches.plan.BatchPlan.time_steps`): a batch holds ``n_envs * time_steps`` frames.
        devices: env, policy and storing devices.
        spec: the rollout options this engine reads (its trajectories: their ids and length limit,
            ``init_random_frames``, ``reset_at_each_iter``, ``exploration_type``), as the collector made them
            (:class:`~acollect._rollout.spec.RolloutSpec`); ``None``: every default.
        env_faults: where an exception of the env's ``step`` or ``reset`` goes (``env_errors="restart"``): the env
            is rebuilt, the episodes in flight end as truncated at their last step recorded, and the batch goes
            on from the new env's reset (:mod:`acollect._rollout.env_faults`); ``None``: the exception is raised.

    Examples:
        >>> from acollect.testing import CountingEnv
        >>> from acollect._devices import resolve_devices
        >>> from acollect._policy import RandomPolicy
        >>> env = CountingEnv(num_envs=2, episode_length=3)
        >>> engine = RolloutEngine(env, RandomPolicy(env.action_spec, (2,)), time_steps=4, devices=resolve_devices())
        >>> batch = engine.collect()
        >>> batch.batch_size, batch.names
        (torch.Size([2, 4]), [None, 'time'])
        >>> batch["collector", "traj_ids"][0].tolist()
        [0, 0, 0, 2]
        >>> engine.close()
    """

    def __init__(
        self,
        env: EnvBase,
        policy: PolicyAdapter,
        *,
        time_steps: int,
        devices: Devices,
        spec: RolloutSpec | None = None,
        env_faults: EnvFaults | None = None,
    ) -> None:
        self.env = env
        self._faults = env_faults
        self.policy = policy
        self.devices = devices
        self.n_envs = env.num_envs
        self.time_steps = time_steps
        self.frames_per_batch = self.n_envs * time_steps
        #: the rollout options, read where they apply
        self.spec = spec if spec is not None else RolloutSpec(create_env_fn=env, frames_per_batch=self.frames_per_batch)
        #: frames collected in completed batches (a resumed engine continues from it)
        self.frames = 0
        #: stamped on every frame of the next batches
        self.policy_version = 0
        #: env steps taken so far (workers report it in heartbeats: a hung env stops it)
        self.steps = 0
        #: where the collecting thread's time goes (env groups share one: they step in one thread)
        self.stopwatch = Stopwatch()
        # Set by split_policy_calls(): the steps yield between sending the observations and taking the actions.
        self._split: SplitPolicy | None = None

        self._root = env.make_root()
        self._next = env.make_next()
        self._keys = TransitionKeys.of(env)
        # One generator for every random action of the engine (the random policy's own, where it is one):
        # seed() must reach the actions actually taken, not a second generator beside them.
        self._random = policy if isinstance(policy, RandomPolicy) else RandomPolicy(env.action_spec, env.batch_size)
        self._trajectories = self.spec.trajectories(self.n_envs)
        self._done_np = self._next.get("done").numpy()  # shares memory: a cheap per-step count
        # The reset the next batch begins with (``None``: it goes on from the last step): one at first.
        self._next_reset: Reset | None = Reset(seed=None)
        # A batch interrupted mid-way, and the steps it holds: the next collect() continues it.
        self._partial: tuple[TensorDict, int] | None = None
        #: frames stepped and then discarded: a partial batch given up by a reseed or a state restore
        self.discarded_frames = 0
        self._out_specs: dict[NestedKey, tuple[torch.Size, torch.dtype]] = {}
        self._read_only_policy = policy.reads_input_only
        self._contained = ContainedFaults.of(env_faults, env)  # None: the whole env is rebuilt after a fault
        self._probe_policy()

    # -- setup -------------------------------------------------------------------
    def _policy_input(self) -> TensorDictBase:
        # A shallow copy: a policy that replaces entries must not detach the engine's buffers. Plain modules
        # only read their inputs and skip it.
        td = self._root if self._read_only_policy else self._root.copy()
        if not self.devices.policy_is_env:
            td = move_to(td, self.devices.policy)
        return td

    def _probe_policy(self) -> None:
        """Runs the policy once on a fresh reset to learn its outputs and check ``"action"``."""
        self.env.reset_into(self._root)
        with torch.inference_mode(), exploration(self.spec.exploration_type):
            outputs = self.policy(self._policy_input())
        check_policy_outputs(outputs, self.n_envs, self.env.action_spec)
        self._out_specs = {k: (v.shape[1:], v.dtype) for k, v in outputs.items()}
        if isinstance(self.env.action_spec, Composite):
            pairs = zip(self.env.action_keys, action_outputs(outputs, self.env.action_spec), strict=True)
            self._keys.actions = [(key, out_key) for key, (out_key, _) in pairs]

    @property
    def _versions_from_policy(self) -> bool:
        """Whether the policy says, per step, which weights chose the action (one answered by an inference server)."""
        return (_COLLECTOR, "policy_version") in self._out_specs

    def split_policy_calls(self) -> SplitPolicy:
        """From now on, :meth:`stepper` yields in every step between sending the observations and taking the actions.

        A caller stepping several engines in turn (:class:`~acollect._rollout.groups.EngineGroups`) steps the others
        while this one's actions are computed elsewhere.

        Returns:
            The policy, to wait on its answer (:meth:`~acollect._policy.SplitPolicy.answer_fileno`).

        Raises:
            ConfigurationError: the policy's calls do not split (it is no :class:`~acollect._policy.SplitPolicy`).
        """
        if not isinstance(self.policy, SplitPolicy):
            raise ConfigurationError.bad_value(
                "policy",
                type(self.policy).__name__,
                "a policy whose calls split in two (submit, receive), such as an inference server's client",
            )
        self._split = self.policy
        return self.policy

    # -- state ---------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Seeds env and random policy; the next batch starts from a fresh, seeded reset.

        A batch interrupted mid-way is given up (its frames counted in :attr:`discarded_frames`): the
        caller asked for a fresh start, and the same seed must give the same batch.
        """
        self._next_reset = Reset(seed=seed)
        self._random.generator.manual_seed(seed)
        self.restart()

    def restart(self) -> None:
        """Starts the next batch from a fresh reset, giving up a batch interrupted mid-way (counted)."""
        if self._next_reset is None:
            self._next_reset = Reset(seed=None)
        if self._partial is not None:
            self.discarded_frames += self._partial[1] * self.n_envs
            self._partial = None

    @property
    def in_batch(self) -> bool:
        """Whether a batch was interrupted mid-way (the next :meth:`collect` continues it)."""
        return self._partial is not None

    @property
    def next_traj_counter(self) -> int:
        """How many trajectory ids were handed out (for state dicts)."""
        return self._trajectories.counter

    @next_traj_counter.setter
    def next_traj_counter(self, value: int) -> None:
        self._trajectories.counter = int(value)

    def _reset_all(self) -> None:
        try:
            self._start(self.env)
        except Exception as exc:
            if self._faults is None:
                raise
            self._recover(exc, None, -1)

    def _start(self, env: EnvBase) -> None:
        """Resets every env of ``env`` into the root buffers: every row begins a new trajectory."""
        reset = self._next_reset
        env.reset_into(self._root, seed=reset.seed if reset is not None else None)
        self._next_reset = None  # only once the reset went well: a rebuilt env is reset the same way
        self._trajectories.start_all()

    def _recover(self, error: Exception, next_td: TensorDictBase | None, last: int) -> None:
        """The env raised ``error``: the episodes in flight end as truncated at step ``last`` of the batch (their
        last step recorded; ``-1``: in a batch handed out already, the new trajectory ids alone mark the end), and a
        rebuilt env (:class:`~acollect._rollout.env_faults.EnvFaults`) is reset in its place."""
        assert self._faults is not None
        if next_td is not None and last >= 0:
            # Rows whose episode ended at that step anyway have none in flight: nothing to mark.
            ended = next_td.get("terminated")[:, last] | next_td.get("truncated")[:, last]
            self._keys.cut(next_td, (slice(None), last), ~ended.squeeze(-1))
        self.env = self._faults.recover(self.env, error, steps=self.steps, start=self._start)
        if self._contained is not None:  # the new env contains its sub-envs' faults as the old one did
            self.env.contain_faults(self._contained.handler)

    @property
    def env_restarts(self) -> int:
        """Envs rebuilt after an exception (``env_errors="restart"``)."""
        return self._faults.restarts if self._faults is not None else 0

    @property
    def env_restarts_by_sub_env(self) -> dict[int, int]:
        """Sub-envs rebuilt alone after they raised, by index."""
        return dict(self._faults.by_sub_env) if self._faults is not None else {}

    # -- the batch -----------------------------------------------------------------
    def allocate(self) -> TensorDict:
        """Empty buffers with the layout of one batch (what :meth:`collect` fills)."""
        E, T, dev = self.n_envs, self.time_steps, self.devices.storing

        def like(t: torch.Tensor) -> torch.Tensor:
            return torch.empty((E, T, *t.shape[1:]), dtype=t.dtype, device=dev)

        batch = TensorDict({}, batch_size=(E, T), device=dev)
        keys = self._keys
        root_keys: list[NestedKey] = [*keys.observations, *DONE_KEYS, *keys.flags]
        for key in root_keys:
            batch.set(key, like(self._root.get(key)))
        for out_key, (shape, dtype) in self._out_specs.items():
            batch.set(out_key, torch.empty((E, T, *shape), dtype=dtype, device=dev))
        nxt = TensorDict({}, batch_size=(E, T), device=dev)
        next_keys: list[NestedKey] = [*keys.observations, *keys.rewards, *DONE_KEYS, *keys.flags]
        for key in next_keys:
            nxt.set(key, like(self._next.get(key)))
        batch.set("next", nxt)
        batch.set((_COLLECTOR, "traj_ids"), torch.empty((E, T), dtype=torch.int64, device=dev))
        batch.set((_COLLECTOR, "policy_version"), torch.empty((E, T), dtype=torch.int64, device=dev))
        # Named here, not only once filled: the layout a worker announces (and its shared-memory slots are built
        # from) carries the names, so a batch read from a slot is named as one sent whole.
        batch.names = [None, "time"]
        return batch

    def collect(
        self,
        stop: threading.Event | None = None,
        *,
        out: TensorDict | None = None,
        between_steps: Callable[[], object] | None = None,
    ) -> TensorDict:
        """Collects one batch (blocking), or finishes the one an interruption left half-way.

        Args:
            stop: when set, collection stops at the next step with :class:`RolloutInterrupted`. Nothing
                is lost: the steps taken are kept, and the next call continues the same batch, so the
                stream of steps stays contiguous (only :meth:`seed` and :meth:`restart` give it up).
            out: fill this TensorDict (the layout of :meth:`allocate`, e.g. a shared-memory slot)
                instead of fresh buffers. Continuing a batch begun in other buffers copies it there.
            between_steps: called before every step (the in-process collector offers the GIL to the
                event loop there, see :class:`~acollect._runtime.threads.GilHandover`).

        Returns:
            A fresh TensorDict ``[n_envs, T]`` that the caller owns, or ``out``.
        """
        steps = self.stepper(stop, out=out, between_steps=between_steps)
        with torch.inference_mode(), exploration(self.spec.exploration_type):
            try:
                while True:
                    next(steps)
            except StopIteration as finished:
                return finished.value

    def stepper(
        self,
        stop: threading.Event | None = None,
        *,
        out: TensorDict | None = None,
        between_steps: Callable[[], object] | None = None,
    ) -> Generator[None, None, TensorDict]:
        """:meth:`collect` as a generator, for a caller that interleaves several engines (and holds inference mode
        and the exploration type around it): after :meth:`split_policy_calls`, it yields between sending a step's
        observations (``policy.submit``) and waiting for the actions (``policy.receive``). Returns the batch.
        """
        start = 0
        if self._partial is not None:
            batch, start = self._partial
            self._partial = None
            if out is not None and out is not batch:
                out.copy_(batch)
                batch = out
        else:
            # Buffers are allocated outside inference mode so that batches can feed autograd later; the
            # steps run inside it, which spares the policy's forward all autograd bookkeeping.
            batch = self.allocate() if out is None else out
        return self._steps(batch, stop, start, between_steps)

    def _steps(
        self,
        batch: TensorDict,
        stop: threading.Event | None,
        start: int,
        between_steps: Callable[[], object] | None = None,
    ) -> Generator[None, None, TensorDict]:
        root, nxt = self._root, self._next
        switch = self.stopwatch.switch
        if start == 0:
            if self._next_reset is not None or self.spec.reset_at_each_iter:
                switch(ENV)
                self._reset_all()
                switch(OTHER)
            # Root done flags are False after every step (a finished env is reset in the same step), so
            # only their state at t=0 needs writing.
            for key in ("done", "terminated", "truncated"):
                batch.get(key).copy_(root.get(key).unsqueeze(1).expand_as(batch.get(key)))
        env = self.env  # read after the reset: one that failed put a rebuilt env in its place

        next_td = batch.get("next")
        keys, trajectories = self._keys, self._trajectories
        root_copies = TimeSlices([(batch.get(k), root.get(k)) for k in [*keys.observations, *keys.flags]])
        next_keys = [*keys.observations, *keys.rewards, "terminated", "truncated", *keys.flags]
        next_copies = TimeSlices([(next_td.get(k), nxt.get(k)) for k in next_keys])
        traj_copy = TimeSlices([(batch.get((_COLLECTOR, "traj_ids")), torch.from_numpy(trajectories.ids))])
        out_slots = [(k, batch.get(k), numpy_view(batch.get(k))) for k in self._out_specs]
        policy, split = self.policy, self._split
        remote = policy if split is None and isinstance(policy, SplitPolicy) else None
        random_until = self.spec.init_random_frames
        env_dev, cast_action = self.devices.env, not self.devices.policy_is_env
        limited = trajectories.max_length is not None  # else no cut, and no count: nothing else here reads lengths
        done_np, count_nonzero = self._done_np, np.count_nonzero
        n = self.n_envs
        faults, contained = self._faults, self._contained
        action_keys = keys.actions

        t = start
        while t < self.time_steps:
            if stop is not None and stop.is_set():
                self._partial = (batch, t)  # kept: the next collect() goes on from step t
                raise RolloutInterrupted
            if between_steps is not None:
                between_steps()
            root_copies.copy(t)
            switch(POLICY)
            if self.frames + t * n < random_until:
                outputs = self._random(None)
            elif split is not None:
                split.submit(self._policy_input())
                try:
                    yield  # the other env groups step while the server runs this one's pass
                    switch(ACTIONS)  # (where the answer is here already, the receive is all this charges)
                    outputs = split.receive()
                except (GeneratorExit, RolloutInterrupted):
                    self._partial = (batch, t)  # step t not taken: continued later (its late answer dropped)
                    raise
            elif remote is not None:
                remote.submit(self._policy_input())
                switch(ACTIONS)  # an inference server's answer, with no other env group to step meanwhile
                outputs = remote.receive()
            else:
                outputs = policy(self._policy_input())
            for out_key, buffer, buffer_np in out_slots:
                write_output(outputs.get(out_key), buffer, buffer_np, t)
            action: torch.Tensor | TensorDict
            if action_keys:
                action = TensorDict({key: outputs[out_key] for key, out_key in action_keys}, batch_size=(n,))
            else:
                action = outputs["action"]
            if cast_action:
                action = move_to(action, env_dev)  # waited for on the way to the host: the env reads it next
            switch(ENV)
            try:
                env.step_and_reset_into(action, nxt, root)
            except Exception as exc:
                if faults is None or isinstance(exc, PolicyError):  # a policy's bad action: no env to rebuild
                    raise
                # The failed step yields no frame: step t is taken again, by the rebuilt env.
                self._recover(exc, next_td, t - 1)
                env = self.env
                continue
            self.steps += 1
            if contained is not None and contained.rows:
                contained.mend(batch, t, keys, trajectories)
            failed_reset: Exception | None = None
            if limited:
                try:
                    self._truncate_long_trajectories()
                except Exception as exc:
                    if faults is None:
                        raise
                    failed_reset = exc  # the step itself is good: it is recorded first
            switch(OTHER)
            next_copies.copy(t)
            traj_copy.copy(t)
            if count_nonzero(done_np):
                # In numpy: on 8 envs, boolean indexing in torch costs as much as a tenth of a CartPole step.
                trajectories.start(np.flatnonzero(done_np))
            if failed_reset is not None:
                self._recover(failed_reset, next_td, t)
                env = self.env
            t += 1

        torch.logical_or(next_td.get("terminated"), next_td.get("truncated"), out=next_td.get("done"))
        if not self._versions_from_policy:
            batch.get((_COLLECTOR, "policy_version")).fill_(self.policy_version)
        self.frames += self.frames_per_batch
        batch.names = [None, "time"]
        return batch

    def _truncate_long_trajectories(self) -> None:
        # A row whose episode ended with this step anyway (done) was reset by the env: it has nothing to cut.
        over = torch.from_numpy(self._trajectories.count_step() & ~self._done_np.reshape(-1))
        if bool(over.any()):
            self._keys.cut(self._next, (), over)
            self.env.reset_into(self._root, mask=over)

    def close(self) -> None:
        """Closes the env and the policy's connections; idempotent."""
        try:
            self.env.close()
        finally:
            self.policy.close()
