"""The soak's envs and accounts: what the workers did (their ledgers), and what the trainer received, checked.

Envs (in the worker processes) keep a ledger per process in a directory the trainer reads at the end:

* ``<pid>``: the batched steps the process's envs took (int64), every env it built included: an env rebuilt after
  a fault goes on counting from where the process stood;
* ``<pid>.faults`` (:class:`FaultyLedgerEnv`): one int64 per fault injected, the process's steps before the step
  that raised, which is where the rebuilt env's first frame stands in the worker's stream;
* ``<pid>.warned``: how many warnings of an env rebuilt whole the process logged (int64);
* ``<pid>.alone``: how many warnings of a sub-env rebuilt alone the process logged (int64);
* ``<pid>.sub<i>`` and ``<pid>.sub<i>.faults`` (:class:`FaultySubEnv`): the same as ``<pid>`` and ``<pid>.faults``
  for sub-env ``i`` of a ``GymEnv``, which is rebuilt alone, every sub-env counting its own steps.

The trainer's side checks the batches as they arrive: :class:`Accounts` the ordinary ones (``[n_envs, T]`` per
worker), :class:`SubEnvAccounts` those of sub-envs rebuilt alone (row by row), :class:`Episodes` those of whole
episodes (``trajs_per_batch``), each against the counting scheme of
:mod:`acollect.testing` (every observation is its sub-env's step counter).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gymnasium.vector import SyncVectorEnv
from tensordict import TensorDictBase

from acollect.envs import GymEnv
from acollect.testing import ENV_STRIDE, RESET_JUMP, CountingEnv, CountingGymEnv, assert_counting_batch

_INT = struct.Struct("<q")
#: What acollect's warnings for an env rebuilt after a fault say (``env_errors="restart"``), by the ledger file that
#: counts them: the whole env rebuilt from its factory, or one sub-env rebuilt alone.
_RESTART_WARNINGS = {"warned": "rebuilding it whole", "alone": "rebuilding it alone"}


class LedgerEnv(CountingEnv):
    """A counting env that writes the steps its process took (its own and those of the envs before it) to
    ``<ledger>/<pid>`` after every step."""

    def __init__(self, ledger: str, num_envs: int, step_time: float, episode_length: int | list[int] = 37) -> None:
        super().__init__(num_envs, episode_length=episode_length, dtype=torch.float64)
        self.step_time = step_time
        self._fd = os.open(os.path.join(ledger, str(os.getpid())), os.O_CREAT | os.O_RDWR, 0o600)
        # An env rebuilt in this process goes on from the steps of the ones before it.
        self.base = _INT.unpack(raw)[0] if len(raw := os.pread(self._fd, 8, 0)) == 8 else 0

    def _before_step(self) -> None:
        if self.step_time:
            time.sleep(self.step_time)

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        super().step_and_reset_into(action, next_out, root_out)
        os.pwrite(self._fd, _INT.pack(self.base + self.step_count), 0)

    def _close(self) -> None:
        os.close(self._fd)


class _WarningLedger(logging.Handler):
    """Counts this process's env-restart warnings into ``<ledger>/<pid>.warned`` and ``<pid>.alone`` (and keeps them
    off stderr)."""

    def __init__(self, ledger: str) -> None:
        super().__init__(logging.WARNING)
        self.paths = {kind: os.path.join(ledger, f"{os.getpid()}.{kind}") for kind in _RESTART_WARNINGS}
        self.counts = dict.fromkeys(_RESTART_WARNINGS, 0)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        kind = next((k for k, says in _RESTART_WARNINGS.items() if says in message), None)
        if kind is None:  # anything else shows as it would have
            sys.stderr.write(self.format(record) + "\n")
            return
        self.counts[kind] += 1
        Path(self.paths[kind]).write_bytes(_INT.pack(self.counts[kind]))

    @classmethod
    def install(cls, ledger: str) -> None:
        """Once per process: every env it builds calls this."""
        acollect_logger = logging.getLogger("acollect")
        if not any(isinstance(h, cls) for h in acollect_logger.handlers):
            acollect_logger.addHandler(cls(ledger))


class FaultyLedgerEnv(LedgerEnv):
    """A :class:`LedgerEnv` that raises at a random step of each life (``env_errors="restart"`` rebuilds it).

    Each env built draws the step that raises uniformly from 2 to ``2 * fault_every`` (mean ``fault_every``): never
    its first, so that every life takes a step and every fault shows in the stream as one rebuild.
    """

    def __init__(self, ledger: str, num_envs: int, step_time: float, fault_every: int, seed: int,
                 episode_length: int | list[int] = 37) -> None:  # fmt: skip
        super().__init__(ledger, num_envs, step_time, episode_length)
        self.faults = os.path.join(ledger, f"{os.getpid()}.faults")
        self.fault_at = random.Random(f"{seed}-{os.getpid()}-{self.base}").randint(2, max(2, 2 * fault_every))
        _WarningLedger.install(ledger)

    def _before_step(self) -> None:
        super()._before_step()
        if self.step_count == self.fault_at:  # step_count counts this step already: the ones before it are done
            with open(self.faults, "ab") as file:
                file.write(_INT.pack(self.base + self.step_count - 1))
            raise RuntimeError(f"soak: env fault injected at step {self.step_count} of its life")


class FaultySubEnv(CountingGymEnv):
    """Sub-env ``index`` of a ``GymEnv`` (counting from ``index * ENV_STRIDE``) that raises at a random step of each
    life, and keeps its own ledger: ``<ledger>/<pid>.sub<index>`` the steps it and the sub-envs it replaced took,
    ``<pid>.sub<index>.faults`` where each fault stands in that stream.

    The step that raises is drawn as :class:`FaultyLedgerEnv`'s (never a life's first: a rebuilt sub-env that raised
    at once would be rebuilt again, two restarts for one rebuild in the stream), seeded per process, sub-env and
    life.
    """

    def __init__(self, ledger: str, index: int, episode_length: int, step_time: float, fault_every: int,
                 seed: int) -> None:  # fmt: skip
        super().__init__(episode_length, start=index * ENV_STRIDE)
        self.step_time = step_time
        path = os.path.join(ledger, f"{os.getpid()}.sub{index}")
        self.faults = f"{path}.faults"
        self._fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        # A sub-env rebuilt in this process goes on from the steps of the ones it replaced.
        self.base = _INT.unpack(raw)[0] if len(raw := os.pread(self._fd, 8, 0)) == 8 else 0
        self.life = 0
        draw = random.Random(f"{seed}-{os.getpid()}-{index}-{self.base}")
        self.fault_at = draw.randint(2, max(2, 2 * fault_every))
        _WarningLedger.install(ledger)

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, object]]:
        if self.step_time:
            time.sleep(self.step_time)
        self.life += 1
        if self.life == self.fault_at:  # the steps of this life before this one are done
            with open(self.faults, "ab") as file:
                file.write(_INT.pack(self.base + self.life - 1))
            raise RuntimeError(f"soak: sub-env fault injected at step {self.life} of its life")
        out = super().step(action)
        os.pwrite(self._fd, _INT.pack(self.base + self.life), 0)
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()


def faulty_sub_envs(ledger: str, lengths: list[int], step_time: float, fault_every: int, seed: int) -> GymEnv:
    """A ``GymEnv`` over a plain ``SyncVectorEnv`` of :class:`FaultySubEnv` (sub-env ``i``'s episodes
    ``lengths[i]`` steps), which rebuilds the sub-env that raised alone (``env_errors="restart"``)."""
    fns = [functools.partial(FaultySubEnv, ledger, i, n, step_time, fault_every, seed) for i, n in enumerate(lengths)]
    return GymEnv(SyncVectorEnv(fns))


class Probe(torch.nn.Module):
    """Acts with ``clamp(w, 0, 1)``: a policy with weights to push."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), value))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).clamp(0, 1).long()


def steps_taken(ledger: Path, pid: int) -> int:
    """The batched steps process ``pid`` took, all its envs together."""
    return _read_int(ledger / str(pid))


def warnings_logged(ledger: Path, pid: int, *, alone: bool = False) -> int:
    """The warnings of an env rebuilt whole (``alone``: of a sub-env rebuilt alone) process ``pid`` logged."""
    return _read_int(ledger / f"{pid}.{'alone' if alone else 'warned'}")


def sub_env_steps(ledger: Path, pid: int, sub: int) -> int:
    """The steps sub-env ``sub`` of process ``pid`` took, all its lives together."""
    return _read_int(ledger / f"{pid}.sub{sub}")


def faults_injected(ledger: Path, pid: int, sub: int | None = None) -> list[int]:
    """Where each fault of process ``pid`` (of its sub-env ``sub``) stands in its stream: its steps before the step
    that raised."""
    file = ledger / (f"{pid}.faults" if sub is None else f"{pid}.sub{sub}.faults")
    data = file.read_bytes() if file.exists() else b""
    return [v for (v,) in _INT.iter_unpack(data[: len(data) // 8 * 8])]


def _read_int(file: Path) -> int:
    return _INT.unpack(file.read_bytes()[:8])[0] if file.exists() and file.stat().st_size >= 8 else 0


def _counting_error(piece: TensorDictBase) -> str | None:
    """What :func:`~acollect.testing.assert_counting_batch` finds wrong with ``piece`` (one env's life), if anything."""
    try:
        assert_counting_batch(piece)
    except AssertionError as exc:
        return str(exc)
    return None


def worker_of(part: TensorDictBase, n_workers: int) -> int:
    """Which worker collected ``part``: worker ``k`` of ``n`` numbers its trajectories ``k, k + n, ...``."""
    return int(part["collector", "traj_ids"].flatten()[0]) % n_workers


class Accounts:
    """What each worker delivered, per incarnation (process), checked batch by batch for gaps and repeats.

    Args:
        n_workers: the collector's workers.
        rebuilds: whether an env may be rebuilt inside a worker (``env_errors="restart"``): then a stream that
            starts again from the env's first observation is a rebuild in the same process (checked: the frame
            before it ends its episodes, the frames from it start new trajectories), recorded where it stands in
            the worker's stream; otherwise it is a new process (a restarted worker).
    """

    def __init__(self, n_workers: int, *, rebuilds: bool = False) -> None:
        self.n_workers = n_workers
        self.rebuilds = rebuilds
        self.incarnations: list[list[int]] = [[] for _ in range(n_workers)]  # batched steps delivered by each
        self.pids: list[list[int]] = [[] for _ in range(n_workers)]  # the processes each worker had, in order
        self.tail: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # worker -> last next_obs, done
        self.rebuilt_at: list[list[int]] = [[] for _ in range(n_workers)]  # where each rebuild stands in the stream
        self.last_traj: dict[int, int] = {}  # worker -> the highest trajectory id delivered
        self.errors: list[str] = []
        self.weights: dict[int, float] = {0: 0.0}  # policy version -> the Probe value pushed with it
        self.last_version = 0

    def versions(self, batch: TensorDictBase, fresh: list[bool]) -> None:
        """Every frame's action is the one the weights of its version chose; one version per batch, never going
        back, except in the part of a worker restarted for it (``fresh``): its predecessor's staged weights died
        with it, so a successor makes its part with the latest weights (docs/reliability.md)."""
        versions = batch["collector", "policy_version"]
        per_worker = [sorted(set(v.flatten().tolist())) for v in versions]
        kept = {v for w, vs in enumerate(per_worker) if not fresh[w] for v in vs}
        if len(kept) > 1 or any(len(vs) > 1 for vs in per_worker):
            self.errors.append(f"a batch mixes policy versions: {per_worker} (restarted for it: {fresh})")
        version = min(kept or {v for vs in per_worker for v in vs})
        if version < self.last_version or any(vs[0] < version for vs in per_worker):
            self.errors.append(f"policy version went back from {self.last_version}: {per_worker}")
        self.last_version = version
        chosen = torch.tensor([self.weights[v] for v in versions.flatten().tolist()]).clamp(0, 1).long()
        if not torch.equal(batch["action"].flatten(), chosen):
            self.errors.append(f"a frame's action was not chosen by the weights of its version ({per_worker})")

    def saw(self, pids: list[int | None]) -> None:
        for w, pid in enumerate(pids):
            if pid is not None and (not self.pids[w] or self.pids[w][-1] != pid):
                self.pids[w].append(pid)

    def delivered(self, worker: int) -> int:
        """Batched steps the worker's current process delivered."""
        return self.incarnations[worker][-1] if self.incarnations[worker] else 0

    def feed(self, worker: int, part: TensorDictBase) -> bool:
        """Checks ``part`` against the worker's last one; returns whether a new incarnation began it."""
        obs = part["observation"][..., 0]
        starts = torch.arange(obs.shape[0], dtype=obs.dtype) * ENV_STRIDE  # each sub-env's first observation
        tail = self.tail.get(worker)
        continues = tail is not None and torch.equal(obs[:, 0], tail[0] + RESET_JUMP * tail[1])
        rebuilt = [t for t in range(1, obs.shape[1]) if torch.equal(obs[:, t], starts)] if self.rebuilds else []
        if self.rebuilds and tail is not None and not continues and torch.equal(obs[:, 0], starts):
            rebuilt.insert(0, 0)  # the first step of this part raised: the frame before it went out already
        bounds = [0, *(t for t in rebuilt if t), obs.shape[1]]
        broken = [e for lo, hi in itertools.pairwise(bounds) if (e := _counting_error(part[:, lo:hi]))]
        if broken:
            self.errors.append(f"worker {worker}: {broken[0]}")
            return False
        fresh = False
        if not rebuilt or rebuilt[0] != 0:
            if not continues:
                # Only a restarted worker's fresh env may break the stream (its first observations).
                offset = obs[:, 0] - starts
                if not bool(((offset >= 0) & (offset <= 2 * RESET_JUMP)).all()):
                    self.errors.append(f"worker {worker}: a gap or repeat between batches")
                self.incarnations[worker].append(0)
                fresh = True
        ids = part["collector", "traj_ids"]
        for t in rebuilt:
            self._rebuilt(worker, part, ids, t)
        self.last_traj[worker] = max(self.last_traj.get(worker, -1), int(ids.max()))
        self.incarnations[worker][-1] += obs.shape[1]
        self.tail[worker] = (part["next", "observation"][:, -1, 0], part["next", "done"][:, -1, 0].to(obs.dtype))
        return fresh

    def _rebuilt(self, worker: int, part: TensorDictBase, ids: torch.Tensor, t: int) -> None:
        """An env rebuilt at step ``t`` of ``part``: the episodes before it end there, new trajectories follow."""
        self.rebuilt_at[worker].append(self.delivered(worker) + t)
        if t:
            ended = part["next", "done"][:, t - 1, 0]
            marked = part["next", "truncated"][:, t - 1, 0] | part["next", "terminated"][:, t - 1, 0]
            if not bool(ended.all() and marked.all()):
                self.errors.append(f"worker {worker}: the frame before a rebuild does not end its episodes "
                                   f"(done {ended.tolist()}, truncated or terminated {marked.tolist()})")  # fmt: skip
        before = max(self.last_traj.get(worker, -1), int(ids[:, :t].max()) if t else -1)
        if not bool((ids[:, t] > before).all()):
            self.errors.append(f"worker {worker}: a rebuilt env's trajectory ids {ids[:, t].tolist()} are not new "
                               f"(up to {before} before it)")  # fmt: skip


@dataclass
class _Tail:
    """The end of what a worker delivered, per row: what its next frame must follow."""

    next_obs: torch.Tensor
    done: torch.Tensor
    ids: torch.Tensor
    in_episode: list[int | None]  # steps of the episode in progress delivered (None: not known)


class SubEnvAccounts:
    """What each worker delivered from sub-envs rebuilt alone (``[n_envs, T]`` per worker, one process each),
    checked row by row as it arrives, across batches too.

    In every row, each frame is a real step, and follows the one before it: the next step of its episode, the first
    after a reset where the episode ended by itself (terminated after exactly its sub-env's episode length), or the
    rebuilt sub-env's first step (its first observation, ``i * ENV_STRIDE``). Only a rebuild ends an episode early:
    the frame before it is truncated (unless its episode ended by itself there, or it went out in the batch before,
    where only the new trajectory id marks the end); a truncation anywhere else, or an episode running past its
    length, is an error, and so is a trajectory id that changes anywhere but at an episode's start, or is not new
    there. Where each rebuild stands in its row's stream is kept, for :meth:`check` against the faults the sub-envs
    injected.

    Args:
        n_workers: the collector's workers (worker ``k`` numbers its trajectories ``k, k + n_workers, ...``).
        lengths: each sub-env's episode length.
    """

    def __init__(self, n_workers: int, lengths: list[int]) -> None:
        self.n_workers = n_workers
        self.lengths = lengths
        self.starts = torch.arange(len(lengths), dtype=torch.float64) * ENV_STRIDE  # each sub-env's first observation
        self.tails: dict[int, _Tail | None] = {}  # None: after a broken frame, the next part starts anew
        self.delivered = [0] * n_workers  # steps of each row delivered
        self.max_traj = [-1] * n_workers
        self.rebuilt_at: dict[tuple[int, int], list[int]] = {}  # (worker, row) -> where each rebuild stands
        self.cut = 0  # rebuilds whose frame before is truncated in the same batch
        self.after_end = 0  # rebuilds right after an episode ended by itself: nothing to cut
        self.at_first_frame = 0  # rebuilds at a batch's first frame: the new trajectory id alone ends the episode
        self.errors: list[str] = []

    def feed(self, worker: int, part: TensorDictBase) -> None:
        """Checks ``part`` (``[n_envs, T]``) against the worker's last one."""
        obs = part["observation"][..., 0].to(torch.float64)
        nxt = part["next", "observation"][..., 0].to(torch.float64)
        done, trunc, term = (part["next", key][..., 0] for key in ("done", "truncated", "terminated"))
        ids = part["collector", "traj_ids"]
        where = f"worker {worker}"
        errors = len(self.errors)
        tail = self.tails.get(worker)
        if tail is None:
            # Its first frames come from its sub-envs' first reset, which may have been reset more than once before
            # the first step (or, after a frame that broke the rules, from anywhere): a tail that they continue.
            offset = obs[:, 0] - self.starts
            if worker not in self.tails and not bool(((offset >= 0) & (offset <= 2 * RESET_JUMP)).all()):
                self.errors.append(f"{where}: first observations {obs[:, 0].tolist()}, not its sub-envs' first")
            known = worker not in self.tails  # after a broken frame, the steps of its episodes are not known
            tail = _Tail(obs[:, 0], torch.zeros_like(done[:, 0]), ids[:, 0], [0 if known else None] * obs.shape[0])
        if not bool((ids % self.n_workers == worker).all()):
            self.errors.append(f"{where}: trajectory ids of another worker {ids.unique().tolist()[:10]}")
        if not bool((nxt - obs == 1).all()):
            self.errors.append(f"{where}: not a real step at {_at(nxt - obs != 1)}")
        if not bool((done == (trunc | term)).all()):
            self.errors.append(f"{where}: done is not truncated or terminated at {_at(done != (trunc | term))}")
        prev_next = torch.cat([tail.next_obs[:, None], nxt[:, :-1]], dim=1)
        prev_done = torch.cat([tail.done[:, None], done[:, :-1]], dim=1)
        continues = obs == prev_next + RESET_JUMP * prev_done.to(obs.dtype)
        rebuilt = (obs == self.starts[:, None]) & ~continues
        if bool((broken := ~continues & ~rebuilt).any()):
            r, t = broken.nonzero()[0].tolist()
            self.errors.append(f"{where} row {r}: a gap or repeat at step {t}: {prev_next[r, t].item()} (done "
                               f"{bool(prev_done[r, t])}) then {obs[r, t].item()}")  # fmt: skip
        if bool((unended := rebuilt[:, 1:] & ~done[:, :-1]).any()):
            self.errors.append(f"{where}: the frame before a rebuild does not end its episode at {_at(unended)}")
        cut_elsewhere = torch.cat([trunc[:, :-1] & ~rebuilt[:, 1:], trunc[:, -1:]], dim=1)
        if bool(cut_elsewhere.any()):
            self.errors.append(f"{where}: an episode truncated with no rebuild after it at {_at(cut_elsewhere)}")
        # Trajectory ids: a new one exactly where an episode begins, never seen before.
        prev_ids = torch.cat([tail.ids[:, None], ids[:, :-1]], dim=1)
        new = ids != prev_ids
        if bool((wrong := new != (prev_done | rebuilt)).any()):
            r, t = wrong.nonzero()[0].tolist()
            self.errors.append(f"{where} row {r}: trajectory id {prev_ids[r, t].item()} -> {ids[r, t].item()} at step "
                               f"{t}, where {'no' if new[r, t] else 'an'} episode begins")  # fmt: skip
        before = torch.cat([torch.tensor([self.max_traj[worker]]), torch.cummax(ids.max(0).values, 0).values[:-1]])
        fresh = ids[new]
        if not bool((fresh > before.expand_as(ids)[new]).all()) or len(fresh.unique()) != len(fresh):
            self.errors.append(f"{where}: a new episode's trajectory id was seen before")
        for r, t in rebuilt.nonzero().tolist():
            self.rebuilt_at.setdefault((worker, r), []).append(self.delivered[worker] + t)
            if t == 0:
                self.at_first_frame += not bool(tail.done[r])
                self.after_end += bool(tail.done[r])
            else:
                self.cut += bool(trunc[r, t - 1])
                self.after_end += bool(term[r, t - 1] & ~trunc[r, t - 1])
        in_episode = [self._episodes(worker, r, tail.in_episode[r], rebuilt[r], done[r], term[r])
                      for r in range(obs.shape[0])]  # fmt: skip
        self.max_traj[worker] = max(self.max_traj[worker], int(ids.max()))
        self.delivered[worker] += obs.shape[1]
        self.tails[worker] = _Tail(nxt[:, -1], done[:, -1], ids[:, -1], in_episode)
        if len(self.errors) > errors:  # one broken frame would fail every later check of its row: start anew
            self.tails[worker] = None

    def _episodes(self, worker: int, row: int, steps: int | None, rebuilt: torch.Tensor, done: torch.Tensor,
                  term: torch.Tensor) -> int | None:  # fmt: skip
        """Checks the lengths of ``row``'s episodes in this part (``steps`` of the first delivered before, ``None``
        if not known); returns the steps of its episode in progress at the end."""
        length, begun = self.lengths[row], 0
        for t in (rebuilt | done).nonzero()[:, 0].tolist():
            if rebuilt[t]:  # the episode before ended here (its steps were checked as they came)
                steps, begun = 0, t
            if done[t]:
                if steps is None:
                    steps, begun = 0, t + 1
                    continue
                steps += t + 1 - begun
                if bool(term[t]) != (steps == length) or steps > length:
                    self.errors.append(f"worker {worker} row {row}: an episode of {steps} steps ended (terminated "
                                       f"{bool(term[t])}) where its episodes last {length}")  # fmt: skip
                steps, begun = 0, t + 1
        if steps is None:
            return None
        steps += len(done) - begun
        if steps >= length:
            self.errors.append(f"worker {worker} row {row}: an episode ran {steps} steps, past its {length}")
        return steps

    def check(self, faults: dict[tuple[int, int], list[int]]) -> list[str]:
        """Every fault injected into a row's sub-env (``faults``: where each stands in that row's stream), among the
        frames delivered, shows as a rebuild there, and no rebuild shows anywhere else."""
        errors = []
        for (worker, row), at in sorted(faults.items()):
            expected = [s for s in at if s < self.delivered[worker]]
            seen = self.rebuilt_at.get((worker, row), [])
            if seen != expected:
                errors.append(f"worker {worker} row {row}: rebuilds at steps {seen[:10]}, faults injected at "
                              f"{expected[:10]} (of its {self.delivered[worker]} steps delivered)")  # fmt: skip
        if stray := sorted(set(self.rebuilt_at) - set(faults)):
            errors.append(f"rebuilds in rows whose sub-envs injected no fault: {stray}")
        return errors

    def rebuilds(self) -> int:
        return sum(len(at) for at in self.rebuilt_at.values())


def _at(mask: torch.Tensor) -> str:
    """The first position (``[row, step]``) where ``mask`` holds."""
    row, step = mask.nonzero()[0].tolist()
    return f"row {row} step {step}"


@dataclass
class Episode:
    """One trajectory handed out whole (``trajs_per_batch``), as the accounts keep it."""

    traj_id: int
    first: float  # its first observation
    last_next: float  # its last next observation
    length: int
    terminated: bool
    truncated: bool


class Episodes:
    """The trajectories a ``trajs_per_batch`` collector handed out, checked one by one as they arrive, then as
    each worker's sub-env's sequence (:meth:`check`).

    Args:
        n_workers: the collector's workers (``traj_id % n_workers`` names a trajectory's worker).
        lengths: each sub-env's episode length.
    """

    def __init__(self, n_workers: int, lengths: list[int]) -> None:
        self.n_workers = n_workers
        self.lengths = lengths
        self.by_env: dict[tuple[int, int], list[Episode]] = {}  # (worker, sub-env) -> its episodes
        self.seen: set[int] = set()
        self.errors: list[str] = []
        self.count = 0
        self.frames = 0

    def feed(self, batch: TensorDictBase) -> None:
        """Checks each trajectory of ``batch`` (``[N, L]`` with a mask): real consecutive steps of one trajectory,
        done at its last frame only, handed out once."""
        mask = batch["collector", "mask"]
        for row in range(batch.shape[0]):
            length = int(mask[row].sum())
            if length < 1 or not bool(mask[row, :length].all()):
                self.errors.append(f"a mask that is not a non-empty prefix: {mask[row].tolist()}")
                continue
            error = self._add(batch[row, :length])
            if error:
                self.errors.append(error)

    def _add(self, traj: TensorDictBase) -> str | None:
        obs = traj["observation"][:, 0]
        nxt = traj["next", "observation"][:, 0]
        done = traj["next", "done"][:, 0]
        ids = traj["collector", "traj_ids"]
        traj_id = int(ids[0])
        if not bool((ids == traj_id).all()):
            return f"trajectory {traj_id}: more than one id {ids.unique().tolist()}"
        if not bool((nxt - obs == 1).all()) or not bool((obs[1:] == nxt[:-1]).all()):
            return f"trajectory {traj_id}: not real consecutive steps: {obs.tolist()} -> {nxt.tolist()}"
        if not bool(done[-1]) or bool(done[:-1].any()):
            return f"trajectory {traj_id}: done flags {done.tolist()}"
        if traj_id in self.seen:
            return f"trajectory {traj_id} handed out twice"
        self.seen.add(traj_id)
        sub = int(obs[0]) // ENV_STRIDE
        if not 0 <= sub < len(self.lengths):
            return f"trajectory {traj_id}: observation {float(obs[0])} is no sub-env's (its counter passed ENV_STRIDE)"
        episode = Episode(traj_id, float(obs[0]), float(nxt[-1]), obs.shape[0],
                          bool(traj["next", "terminated"][-1, 0]), bool(traj["next", "truncated"][-1, 0]))  # fmt: skip
        self.by_env.setdefault((traj_id % self.n_workers, sub), []).append(episode)
        self.count += 1
        self.frames += obs.shape[0]
        return None

    def handed_out(self, worker: int, sub: int) -> int:
        """Frames of the worker's sub-env handed out: its first steps, when :meth:`check` finds no gap."""
        return sum(e.length for e in self.by_env.get((worker, sub), []))

    def check(self, faults: dict[int, list[int]], lost: int | None) -> list[str]:
        """Each worker's sub-env's episodes, in the order of their ids: the first from the env's first reset, each
        next from the reset after the one before (or, after a fault, from a rebuilt env's first reset); every one
        whole (terminated after exactly its sub-env's episode length) or truncated where a fault of its worker
        (``faults``: where each stands in the worker's stream) or its loss (worker ``lost``: its last) ended it;
        and every fault inside the frames handed out shows as a rebuild there."""
        errors: list[str] = []
        for (worker, sub), episodes in sorted(self.by_env.items()):
            episodes.sort(key=lambda e: e.traj_id)
            where = f"worker {worker} sub-env {sub}"
            start = float(sub * ENV_STRIDE)
            at, rebuilt, expected = 0, [], {s for s in faults.get(worker, []) if s < self.handed_out(worker, sub)}
            for i, episode in enumerate(episodes):
                # A worker's first env may be reset more than once before its first step (as in Accounts.feed).
                if i == 0 and episode.first not in (start, start + RESET_JUMP, start + 2 * RESET_JUMP):
                    errors.append(f"{where}: its first episode starts at {episode.first}, not at the env's first")
                if i and episode.first == start:
                    rebuilt.append(at)
                elif i and episode.first != episodes[i - 1].last_next + RESET_JUMP:
                    errors.append(f"{where}: a gap or repeat before trajectory {episode.traj_id}")
                at += episode.length
                last = i == len(episodes) - 1
                if episode.terminated and episode.length != self.lengths[sub]:
                    errors.append(f"{where}: trajectory {episode.traj_id} terminated after {episode.length} steps")
                if not episode.terminated and not (
                    episode.truncated and (at in faults.get(worker, []) or (last and worker == lost))
                ):
                    errors.append(f"{where}: trajectory {episode.traj_id} ended neither whole nor truncated by a "
                                  f"fault or the loss ({episode.length} steps)")  # fmt: skip
            if sorted(rebuilt) != sorted(expected):
                errors.append(f"{where}: rebuilds at steps {rebuilt[:10]}, faults at {sorted(expected)[:10]}")
        return errors

    def truncated(self) -> int:
        return sum(e.truncated for episodes in self.by_env.values() for e in episodes)
