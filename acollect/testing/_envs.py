"""Test envs and stream checks for code that drives collectors (acollect's own tests use them too).

* :class:`CountingEnv`: a pure-torch batched env whose observation is a
  counter, so a collected stream can be checked for gaps, duplicates and
  transitions that did not happen (:func:`assert_counting_batch`);
* :class:`CrashingEnv`: a counting env that raises at a chosen step;
* :class:`SlowEnv`: a counting env whose steps take a chosen time;
* :class:`Gate` and its :class:`GatedEnv`: a counting env held mid-batch, in any process, until the test
  opens the gate;
* :class:`PixelEnv`: synthetic image observations with no step cost (a transport workload);
* and the stream check :func:`assert_counting_batch`, and :func:`wait_until`.

The ``gymnasium.Env`` ones (a counting one, a crashing one, an echo of the action) are in
:mod:`acollect.testing._gym_envs`.

The counting scheme (shared by :class:`CountingEnv` and
:class:`~acollect.testing._gym_envs.CountingGymEnv`):
sub-env ``i`` starts at ``start + i * ENV_STRIDE`` (its first reset observes
that value); every step adds 1 and every later reset adds ``RESET_JUMP`` (100).
So in any real transition ``next_obs - obs == 1``; after an episode end the
next episode starts ``RESET_JUMP`` above the final observation, which is
neither 0 nor 1 on purpose: a no-op autoreset transition (``+RESET_JUMP``), or
a reset observation passed off as the final one (``+RESET_JUMP + 1``), both
break ``next_obs - obs == 1``. Values are unique per sub-env and, below
``ENV_STRIDE`` steps, across sub-envs. float32 holds integers exactly up to
2**24: past 16 sub-envs or about a million steps, pass ``dtype=torch.float64``.

Examples:
    >>> import torch
    >>> from acollect.testing import CountingEnv
    >>> env = CountingEnv(num_envs=2, episode_length=2)
    >>> root = env.reset()
    >>> root["observation"].squeeze(-1).tolist()
    [0.0, 1000000.0]
    >>> action = torch.zeros(2, dtype=torch.int64)
    >>> env.step(root.set("action", action))["observation"].squeeze(-1).tolist()
    [1.0, 1000001.0]
    >>> out = env.step(root.set("action", action))
    >>> out["observation"].squeeze(-1).tolist(), out["terminated"].squeeze(-1).tolist()
    ([2.0, 1000002.0], [True, True])
    >>> env.last_root["observation"].squeeze(-1).tolist()  # the next episode, RESET_JUMP higher
    [102.0, 1000102.0]
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import torch
from tensordict import TensorDictBase

from acollect.envs import DONE_KEYS, EnvBase
from acollect.errors import ConfigurationError, PolicyError
from acollect.specs import Categorical, Composite, Unbounded

__all__ = [
    "ENV_STRIDE",
    "RESET_JUMP",
    "CountingEnv",
    "CrashingEnv",
    "Gate",
    "GatedEnv",
    "PixelEnv",
    "SlowEnv",
    "assert_counting_batch",
    "positive_int",
    "wait_until",
]

#: Distance between the starts of two sub-envs' counters.
ENV_STRIDE = 1_000_000
#: What a reset adds to the counter (a step adds 1).
RESET_JUMP = 100


def positive_int(name: str, value: object) -> int:
    """``value``, refused unless it is an int of at least 1 (an env's sizes and steps)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError.bad_value(name, value, "a positive int")
    return value


class CountingEnv(EnvBase):
    """A batched env whose observation counts its sub-env's steps and resets.

    Episodes end with ``terminated=True`` after ``episode_length`` steps; the
    reward is always 1.0 and the action (``Categorical(n_actions)``) is ignored. The
    env is deterministic: seeds are accepted and ignored.

    Args:
        num_envs: number of sub-envs.
        episode_length: steps per episode, one int for all sub-envs or one per sub-env.
        start: the first observation of sub-env 0 (sub-env ``i`` starts at ``start + i * ENV_STRIDE``).
        dtype: observation dtype.
        device: where the env's tensors live.
        n_actions: size of the discrete action space: more than two lets a probe policy
            (:class:`~acollect.testing.WeightProbe` with ``high``) tell many weight versions apart by its actions.

    Attributes:
        counter: int64 ``[num_envs]``, each sub-env's current observation.
        episode_id: int64 ``[num_envs]``, episodes started by each sub-env (0 during the first).
        steps_taken: int64 ``[num_envs]``, steps taken by each sub-env since construction.
        step_count: number of batched steps taken.
        last_action: the last action received (a clone), or ``None``.
    """

    def __init__(
        self,
        num_envs: int = 1,
        episode_length: int | Sequence[int] = 10,
        *,
        start: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        n_actions: int = 2,
    ) -> None:
        n = positive_int("num_envs", num_envs)
        lengths = [episode_length] * n if isinstance(episode_length, int) else list(episode_length)
        if len(lengths) != n or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in lengths):
            raise ConfigurationError.bad_value(
                "episode_length", episode_length, f"a positive int or {n} positive ints (one per sub-env)"
            )
        self.device = torch.device(device)
        self.batch_size = torch.Size([n])
        self.observation_spec = Composite(observation=Unbounded((1,), dtype=dtype, device=self.device))
        self.action_spec = Categorical(positive_int("n_actions", n_actions), device=self.device)
        self.reward_spec = Unbounded((1,), dtype=torch.float32, device=self.device)
        self.episode_length = torch.tensor(lengths, dtype=torch.int64, device=self.device)
        first = start + torch.arange(n, dtype=torch.int64, device=self.device) * ENV_STRIDE
        self.counter = first - RESET_JUMP  # the first reset lands on `first`
        self.episode_id = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        self.steps_taken = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.step_count = 0
        self.last_action: torch.Tensor | None = None
        self._in_episode = torch.zeros(n, dtype=torch.int64, device=self.device)

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        self._check_open()
        rows: Any = slice(None)
        if mask is not None:
            rows = mask.reshape(-1).to(device=self.device, dtype=torch.bool)
            if rows.shape != self.batch_size:
                raise ConfigurationError.bad_value(
                    "mask", tuple(mask.shape), f"a bool tensor of shape ({self.num_envs},)"
                )
        self.counter[rows] += RESET_JUMP
        self._in_episode[rows] = 0
        self.episode_id[rows] += 1
        obs = out.get("observation")
        obs[rows] = self.counter[rows].unsqueeze(-1).to(obs.dtype)
        for key in DONE_KEYS:
            out.get(key)[rows] = False

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._check_open()
        if action.shape[:1] != self.batch_size:
            raise PolicyError(
                f"action of shape {tuple(action.shape)} is not batched like the env: expected ({self.num_envs}, ...)"
            )
        self.step_count += 1
        self._before_step()
        self.last_action = action.clone()
        self.counter += 1
        self._in_episode += 1
        self.steps_taken += 1
        done = self._in_episode >= self.episode_length
        next_out.get("observation").copy_(self.counter.unsqueeze(-1))
        next_out.get("reward").fill_(1.0)
        next_out.get("terminated").copy_(done.unsqueeze(-1))
        next_out.get("done").copy_(done.unsqueeze(-1))
        next_out.get("truncated").zero_()
        if bool(done.any()):
            self.counter[done] += RESET_JUMP
            self._in_episode[done] = 0
            self.episode_id[done] += 1
        root_out.get("observation").copy_(self.counter.unsqueeze(-1))
        for key in DONE_KEYS:
            root_out.get(key).zero_()

    def _before_step(self) -> None:
        """Hook for subclasses: runs at the start of every step, after ``step_count`` was increased."""

    def _close(self) -> None:
        pass


class CrashingEnv(CountingEnv):
    """A :class:`CountingEnv` that raises ``exc_type`` at its ``crash_at_step``-th step.

    Steps are counted across episodes, from 1; resets do not count.

    Args:
        crash_at_step: the step that raises (1 = the first).
        num_envs: number of sub-envs.
        exc_type: the exception class raised, called with one message argument.
        **kwargs: passed to :class:`CountingEnv` (``episode_length``, ``start``, ...).

    Examples:
        >>> import torch
        >>> from acollect.testing import CrashingEnv
        >>> env = CrashingEnv(crash_at_step=1)
        >>> root = env.reset()
        >>> env.step(root.set("action", torch.zeros(1, dtype=torch.int64)))
        Traceback (most recent call last):
        ...
        RuntimeError: CrashingEnv crashed at step 1 (crash_at_step=1)
    """

    def __init__(
        self,
        crash_at_step: int,
        num_envs: int = 1,
        exc_type: Callable[[str], BaseException] = RuntimeError,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_envs, **kwargs)
        self.crash_at_step = positive_int("crash_at_step", crash_at_step)
        self.exc_type = exc_type

    def _before_step(self) -> None:
        if self.step_count == self.crash_at_step:
            raise self.exc_type(f"CrashingEnv crashed at step {self.step_count} (crash_at_step={self.crash_at_step})")


class SlowEnv(CountingEnv):
    """A :class:`CountingEnv` whose every step sleeps ``step_time`` seconds (a slow simulator).

    Args:
        step_time: seconds each step takes.
        num_envs: number of sub-envs.
        reset_time: seconds each reset takes.
        **kwargs: passed to :class:`CountingEnv`.
    """

    def __init__(self, step_time: float, num_envs: int = 1, *, reset_time: float = 0.0, **kwargs: Any) -> None:
        for name, value in (("step_time", step_time), ("reset_time", reset_time)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigurationError.bad_value(name, value, "a number of seconds >= 0")
        super().__init__(num_envs, **kwargs)
        self.step_time = float(step_time)
        self.reset_time = float(reset_time)

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        if self.reset_time:
            time.sleep(self.reset_time)
        super().reset_into(out, mask=mask, seed=seed)

    def _before_step(self) -> None:
        time.sleep(self.step_time)


class Gate:
    """A gate a test holds an env at, in this process or in a worker's: the env is mid-batch until the test opens it.

    An env made by :meth:`env` (a :class:`GatedEnv`) reaches its ``hold_at_step``-th step and waits there, with
    the batch it is collecting half done, until the test calls :meth:`open`: meanwhile the test does what must
    happen while a worker is mid-batch (push weights, kill it) and knows it is so, without a sleep. The gate is a
    directory of marker files, so that envs in worker processes (forked, spawned or from a fork server) share it.
    Only the first env that reaches its step holds (it claims the gate): every other one, and an env built again
    from the same factory in a restarted worker, passes.

    Used as a context manager, it is opened on exit, so that no env stays held after a failed test.

    Args:
        directory: a directory of its own, made if missing (pytest's ``tmp_path``).

    Examples:
        >>> import tempfile, torch
        >>> from acollect.testing import Gate
        >>> with tempfile.TemporaryDirectory() as tmp, Gate(tmp) as gate:
        ...     env = gate.env(hold_at_step=2)()
        ...     root = env.reset().set("action", torch.zeros(1, dtype=torch.int64))
        ...     _ = env.step(root)
        ...     gate.open()  # else the second step would wait here for it
        ...     _ = env.step(root)
        ...     gate.held, gate.holder == os.getpid()
        (True, True)
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)

    def env(self, hold_at_step: int, num_envs: int = 1, **kwargs: Any) -> functools.partial[GatedEnv]:
        """A picklable factory of :class:`GatedEnv` held at its ``hold_at_step``-th step (counted from 1).

        ``kwargs`` go to :class:`GatedEnv` (``timeout``) and :class:`CountingEnv` (``episode_length``, ...).
        """
        return functools.partial(GatedEnv, self.directory, hold_at_step, num_envs, **kwargs)

    @property
    def held(self) -> bool:
        """Whether an env claimed the gate (it waits there until :meth:`open`, or passed it once opened)."""
        return os.path.exists(os.path.join(self.directory, GatedEnv.HELD))

    @property
    def holder(self) -> int | None:
        """The process id of the env that claimed the gate (``None``: none yet)."""
        try:
            with open(os.path.join(self.directory, GatedEnv.HELD)) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    async def wait_held(self, timeout: float = 30.0) -> None:
        """Waits until an env holds at the gate.

        Raises:
            TimeoutError: none did within ``timeout`` seconds.
        """
        await wait_until(lambda: self.holder is not None, timeout=timeout, interval=0.002)

    def open(self) -> None:
        """Lets the held env go on, and every env after it pass."""
        with open(os.path.join(self.directory, GatedEnv.OPEN), "w"):
            pass

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()


class GatedEnv(CountingEnv):
    """A :class:`CountingEnv` that holds at its ``hold_at_step``-th step until its :class:`Gate` is opened.

    Made by :meth:`Gate.env`. Only the first env of a gate that reaches its step holds: it claims the gate by
    creating the marker file ``held`` (holding its process id), which no other env can create again.

    Args:
        gate: the gate's directory.
        hold_at_step: the step that waits (1 = the first), counted from this env's construction.
        num_envs: number of sub-envs.
        timeout: seconds the step waits for the gate before it raises ``TimeoutError`` (a test that never opens
            it fails instead of hanging).
        **kwargs: passed to :class:`CountingEnv`.
    """

    HELD = "held"
    OPEN = "open"

    def __init__(
        self, gate: str, hold_at_step: int, num_envs: int = 1, *, timeout: float = 60.0, **kwargs: Any
    ) -> None:
        super().__init__(num_envs, **kwargs)
        self.gate = gate
        self.hold_at_step = positive_int("hold_at_step", hold_at_step)
        self.timeout = float(timeout)

    def _before_step(self) -> None:
        if self.step_count == self.hold_at_step:
            self._hold()

    def _hold(self) -> None:
        try:
            fd = os.open(os.path.join(self.gate, self.HELD), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # another env holds, or held, the gate
        os.write(fd, str(os.getpid()).encode())  # whole before the test reads it: it waits for a pid, not the file
        os.close(fd)
        opened = os.path.join(self.gate, self.OPEN)
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(opened):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate at {self.gate} was not opened within {self.timeout}s")
            time.sleep(0.001)


class PixelEnv(EnvBase):
    """Synthetic image observations (``84x84x4`` uint8 by default) with no step cost: a transport workload.

    Every step fills the ``"pixels"`` observation with one value (the step count modulo 251), gives
    reward 1 and never ends an episode, so what a collector measures with it is only the cost of moving
    frames.

    Args:
        num_envs: number of sub-envs.
        shape: per-env observation shape.

    Examples:
        >>> env = PixelEnv(num_envs=2)
        >>> env.reset()["pixels"].shape
        torch.Size([2, 84, 84, 4])
    """

    def __init__(self, num_envs: int = 1, shape: tuple[int, ...] = (84, 84, 4)) -> None:
        self.batch_size = torch.Size([positive_int("num_envs", num_envs)])
        self.observation_spec = Composite(pixels=Unbounded(shape, dtype=torch.uint8))
        self.action_spec = Categorical(2)
        self._t = 0

    def reset_into(self, out: TensorDictBase, *, mask: torch.Tensor | None = None, seed: int | None = None) -> None:
        rows = slice(None) if mask is None else mask.reshape(-1)
        out.get("pixels")[rows] = 0
        for key in DONE_KEYS:
            out.get(key)[rows] = False

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        self._t += 1
        next_out.get("pixels").fill_(self._t % 251)
        next_out.get("reward").fill_(1.0)
        for key in DONE_KEYS:
            next_out.get(key).zero_()
        root_out.get("pixels").copy_(next_out.get("pixels"))

    def _close(self) -> None:
        pass


def assert_counting_batch(batch: TensorDictBase, *, key: str | tuple[str, ...] = "observation") -> None:
    """Asserts that a batch collected from counting envs holds only real, gap-free transitions.

    ``batch`` has the collector layout ``[..., T]`` (time last; the leading dims
    are sub-envs and workers, stacked or concatenated; not split into
    trajectories). Checks, for every sub-env:

    * ``next_obs - obs == 1`` at every step: each transition is a real step
      (no no-op autoreset step, no reset observation passed off as a final one);
    * ``obs[t + 1] == next_obs[t]`` within an episode and ``next_obs[t] + RESET_JUMP``
      after a ``done``: nothing was lost or repeated between steps.

    Raises:
        AssertionError: naming the first offending position.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> obs = torch.tensor([[[0.0], [1.0], [102.0]]])
        >>> nxt = TensorDict(observation=obs + 1, done=torch.tensor([[[False], [True], [False]]]), batch_size=[1, 3])
        >>> assert_counting_batch(TensorDict(observation=obs, next=nxt, batch_size=[1, 3]))
    """
    key_t = (key,) if isinstance(key, str) else tuple(key)
    obs = batch.get(key_t).to(torch.float64).reshape(*batch.batch_size, -1)
    nxt = batch.get(("next", *key_t)).to(torch.float64).reshape(*batch.batch_size, -1)
    done = batch.get(("next", "done")).reshape(*batch.batch_size, 1)
    bad = (nxt - obs != 1).any(-1)
    if bool(bad.any()):
        where = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"not a real transition at {where}: obs={obs[where].tolist()} next={nxt[where].tolist()}")
    expected = nxt[..., :-1, :] + RESET_JUMP * done[..., :-1, :]
    gap = (obs[..., 1:, :] != expected).any(-1)
    if bool(gap.any()):
        where = tuple(gap.nonzero()[0].tolist())
        then = (*where[:-1], where[-1] + 1)
        raise AssertionError(
            f"gap or repeat after {where}: next_obs={nxt[where].tolist()} done={bool(done[where].item())} "
            f"then obs={obs[then].tolist()}"
        )


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Waits until ``predicate()`` is true, checking every ``interval`` seconds.

    Handy for tests of background collection ("until the buffer holds N frames").

    Args:
        predicate: a cheap, non-blocking check.
        timeout: seconds before giving up.
        interval: seconds between checks.

    Raises:
        TimeoutError: ``predicate()`` was still false after ``timeout`` seconds.

    Examples:
        >>> import anyio
        >>> anyio.run(lambda: wait_until(lambda: True))
    """
    with anyio.move_on_after(timeout):
        for _ in itertools.count():
            if predicate():
                return
            await anyio.sleep(interval)
    if not predicate():
        raise TimeoutError(f"the condition was still false after {timeout}s")
