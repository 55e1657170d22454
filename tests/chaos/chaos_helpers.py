"""Envs, a policy and stream checks for the chaos tests (importable in worker processes by module name).

The leak checks and the probe policy this builds on are public: :mod:`acollect.testing`.

Every worker writes what it did to a *ledger* directory, one small file per process id, so a test can
compare what the workers really did with what the collector handed out:

* ``<pid>.steps``: batched env steps taken so far (rewritten after every step);
* ``<pid>.closed``: the env was closed (the worker shut down gracefully, not killed);
* ``<pid>.w``: the policy weight the worker held when its env was closed.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect.testing import ENV_STRIDE, RESET_JUMP, CountingEnv, WeightProbe, assert_counting_batch

#: Deadlines that bound a hang; they do not measure speed.
NOTICE = 10.0


def env_int(name: str, default: int) -> int:
    """An int from the environment (how hard the suite pushes)."""
    return int(os.environ.get(name, default))


def ipc_file_exists(address: str) -> bool:
    """Whether the socket file of an ``ipc://`` address is still there."""
    return os.path.exists(address.removeprefix("ipc://"))


class StepLimitError(Exception):
    """A user-defined error raised deep inside an env (its type name must reach the trainer)."""


# The policy module each worker process stepped with last: the env reports its weight on close.
_ACTIVE_POLICY: dict[int, LedgerPolicy] = {}


class LedgerEnv(CountingEnv):
    """A :class:`~acollect.testing.CountingEnv` that writes its step count to ``<ledger_dir>/<pid>.steps``.

    Args:
        ledger_dir: the ledger directory.
        step_time: seconds each step sleeps (``0``: none; ``inf``: the step never returns).
        **kwargs: passed to :class:`~acollect.testing.CountingEnv`.
    """

    def __init__(self, ledger_dir: str, *, step_time: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ledger_dir = ledger_dir
        self.step_time = step_time
        self._fd = os.open(os.path.join(ledger_dir, f"{os.getpid()}.steps"), os.O_CREAT | os.O_WRONLY, 0o600)
        os.pwrite(self._fd, struct.pack("<q", 0), 0)

    def _before_step(self) -> None:
        if self.step_time == float("inf"):
            while True:  # a simulator stuck for good
                time.sleep(3600)
        if self.step_time:
            time.sleep(self.step_time)

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        super().step_and_reset_into(action, next_out, root_out)
        os.pwrite(self._fd, struct.pack("<q", self.step_count), 0)

    def _close(self) -> None:
        os.close(self._fd)
        pid = os.getpid()
        policy = _ACTIVE_POLICY.get(pid)
        if policy is not None:
            Path(self.ledger_dir, f"{pid}.w").write_text(repr(float(policy.w)))
        Path(self.ledger_dir, f"{pid}.closed").touch()


def never_built() -> CountingEnv:
    """An env factory that never returns (a simulator stuck while it loads): its worker never says hello, and never
    reads a ``stop``."""
    while True:
        time.sleep(3600)


class LedgerPolicy(WeightProbe):
    """A :class:`~acollect.testing.WeightProbe` whose worker's env writes ``w`` to the ledger when it closes."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        _ACTIVE_POLICY[os.getpid()] = self
        return super().forward(observation)


@dataclass
class Ledger:
    """Reads what the workers wrote."""

    path: Path

    def steps(self, pid: int) -> int:
        """Batched steps the worker with ``pid`` took (``0`` if it never built its env)."""
        file = self.path / f"{pid}.steps"
        return struct.unpack("<q", file.read_bytes()[:8])[0] if file.exists() else 0

    def closed(self, pid: int) -> bool:
        """Whether the worker closed its env (a graceful stop)."""
        return (self.path / f"{pid}.closed").exists()

    def weight(self, pid: int) -> float | None:
        """The policy weight the worker held at its graceful stop."""
        file = self.path / f"{pid}.w"
        return float(file.read_text()) if file.exists() else None


@dataclass
class Incarnation:
    """The batches one worker process delivered: ``steps`` batched steps, gap-free from its first."""

    steps: int = 0
    traj_ids: set[int] = field(default_factory=set)


class StreamChecker:
    """Checks batches of counting envs as they come, keeping only what the checks need.

    Each stream (a worker) is cut into incarnations: every batch must continue the previous batch of its
    stream exactly, step for step, unless its first observations are a fresh env's (``i * ENV_STRIDE``
    plus a reset or two): then a new incarnation starts (a restarted worker's env starts over). Within a batch,
    :func:`~acollect.testing.assert_counting_batch` checks every transition.
    """

    def __init__(self) -> None:
        self.streams: dict[Any, list[Incarnation]] = {}
        self._tail: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def feed(self, stream: Any, batch: TensorDictBase) -> None:
        """Checks one ``[n_envs, T]`` batch of ``stream``."""
        assert_counting_batch(batch)
        obs = batch["observation"][..., 0].to(torch.float64)  # [E, T]
        tail = self._tail.get(stream)
        if tail is None or not torch.equal(obs[:, 0], tail[0] + RESET_JUMP * tail[1]):
            # Not the continuation of the stream: only a fresh env may start here (its first observations,
            # after the reset or two a worker does before collecting).
            first = torch.arange(obs.shape[0], dtype=torch.float64) * ENV_STRIDE
            offset = obs[:, 0] - first
            fresh = bool(((offset >= 0) & (offset <= 2 * RESET_JUMP) & (offset % RESET_JUMP == 0)).all())
            assert fresh, (
                f"stream {stream!r}: a gap or repeat between batches: {obs[:, 0].tolist()} after "
                f"{None if tail is None else tail[0].tolist()}"
            )
            self.streams.setdefault(stream, []).append(Incarnation())
        incarnation = self.streams[stream][-1]
        incarnation.steps += obs.shape[1]
        ids = set(batch["collector", "traj_ids"].unique().tolist())
        for other in (i for s in self.streams.values() for i in s if i is not incarnation):
            assert not ids & other.traj_ids, f"trajectory ids {sorted(ids & other.traj_ids)} delivered twice"
        incarnation.traj_ids |= ids
        nxt_obs = batch["next", "observation"][..., -1, 0].to(torch.float64)
        done = batch["next", "done"][..., -1, 0].to(torch.float64)
        self._tail[stream] = (nxt_obs, done)


class Tripwire:
    """Pickles to bytes that create ``path`` when unpickled: proof that nobody unpickled them."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Path.touch, (self.path,))
