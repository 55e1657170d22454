"""Soak test: collect for minutes while workers are killed, paused, updated and starved by a slow trainer.

A MultiSyncCollector drives counting envs (each observation is its env's step counter, see
``acollect.testing``) in worker processes that keep a ledger of the steps they took, so every frame is
accounted for: what the trainer received is checked for gaps and duplicates as it arrives (and every
frame's action against the weights of the policy version it carries), and at the
end each killed worker's ledger says how many frames it collected that never arrived (the batch in
flight at the kill), to compare with the collector's ``dropped_batches``.

Faults, at random moments (seeded): SIGKILL of a random worker (mid-batch or between batches), a
``pause()`` of the trainer, a weight push, and phases where the trainer sleeps ten times longer than a
batch takes. Prints frames collected, frames lost and why, kills survived, pauses, pushes, max RSS and
open file descriptors at start and end; exits with status 1 if any check failed.

Examples::

    python benchmarks/soak.py --minutes 2
    python benchmarks/soak.py --minutes 10 --workers 2 --kill-every 5 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import torch
from tensordict import TensorDictBase

from acollect import MultiSyncCollector
from acollect.testing import ENV_STRIDE, RESET_JUMP, CountingEnv, assert_counting_batch


class LedgerEnv(CountingEnv):
    """A counting env that writes the steps it took to ``<ledger>/<pid>`` after every step."""

    def __init__(self, ledger: str, num_envs: int, step_time: float) -> None:
        super().__init__(num_envs, episode_length=37, dtype=torch.float64)
        self.step_time = step_time
        self._fd = os.open(os.path.join(ledger, str(os.getpid())), os.O_CREAT | os.O_WRONLY, 0o600)

    def _before_step(self) -> None:
        if self.step_time:
            time.sleep(self.step_time)

    def step_and_reset_into(self, action: torch.Tensor, next_out: TensorDictBase, root_out: TensorDictBase) -> None:
        super().step_and_reset_into(action, next_out, root_out)
        os.pwrite(self._fd, struct.pack("<q", self.step_count), 0)

    def _close(self) -> None:
        os.close(self._fd)


class Probe(torch.nn.Module):
    """Acts with ``clamp(w, 0, 1)``: a policy with weights to push."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), value))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w).clamp(0, 1).long()


class Accounts:
    """What each worker delivered, per incarnation (process), checked batch by batch for gaps and repeats."""

    def __init__(self, n_workers: int) -> None:
        self.incarnations: list[list[int]] = [[] for _ in range(n_workers)]  # batched steps delivered by each
        self.pids: list[list[int]] = [[] for _ in range(n_workers)]  # the processes each worker had, in order
        self.tail: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # worker -> last next_obs, done
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

    def feed(self, worker: int, part: TensorDictBase) -> bool:
        """Checks ``part`` against the worker's last one; returns whether a new incarnation began it."""
        try:
            assert_counting_batch(part)
        except AssertionError as exc:
            self.errors.append(f"worker {worker}: {exc}")
            return False
        fresh = False
        obs = part["observation"][..., 0]
        tail = self.tail.get(worker)
        if tail is None or not torch.equal(obs[:, 0], tail[0] + RESET_JUMP * tail[1]):
            # Only a restarted worker's fresh env may break the stream (its first observations).
            offset = obs[:, 0] - torch.arange(obs.shape[0], dtype=obs.dtype) * ENV_STRIDE
            if not bool(((offset >= 0) & (offset <= 2 * RESET_JUMP)).all()):
                self.errors.append(f"worker {worker}: a gap or repeat between batches")
            self.incarnations[worker].append(0)
            fresh = True
        self.incarnations[worker][-1] += obs.shape[1]
        self.tail[worker] = (part["next", "observation"][:, -1, 0], part["next", "done"][:, -1, 0].to(obs.dtype))
        return fresh


def _steps_taken(ledger: Path, pid: int) -> int:
    file = ledger / str(pid)
    return struct.unpack("<q", file.read_bytes()[:8])[0] if file.exists() and file.stat().st_size >= 8 else 0


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    ledger = Path(tempfile.mkdtemp(prefix="soak-ledger-"))
    process = psutil.Process()
    n_steps = args.steps
    env = (LedgerEnv, str(ledger), args.envs, args.step_time)
    collector = MultiSyncCollector(
        [lambda: env[0](*env[1:])] * args.workers,
        Probe(0.0),
        frames_per_batch=args.workers * args.envs * n_steps,
        max_worker_restarts=10**9,
        heartbeat_timeout=10.0,
        start_method=args.start_method,
    )
    accounts = Accounts(args.workers)
    stats: dict[str, Any] = {"kills": 0, "kills_mid_batch": 0, "pauses": 0, "pushes": 0, "slow_batches": 0,
                             "max_push_s": 0.0, "max_restart_notice_s": 0.0, "batches": 0}  # fmt: skip
    killed: set[int] = set()
    pending_kills: list[tuple[int, float]] = []  # (pid, when) until the restart is seen
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 60 * args.minutes
    async with collector:
        accounts.saw(collector.worker_pids)
        batch = await anext(collector)
        fds_start, rss_start = len(os.listdir("/proc/self/fd")), process.memory_info().rss
        stats["max_rss"] = rss_start
        last = time.monotonic()
        batch_time = 0.05
        slow_left = 0
        while time.monotonic() < deadline:
            accounts.versions(batch, [accounts.feed(w, batch[w]) for w in range(args.workers)])
            accounts.saw(collector.worker_pids)
            stats["batches"] += 1
            now = time.monotonic()
            for pid, when in list(pending_kills):
                accounts.saw(collector.worker_pids)
                if pid not in collector.worker_pids:
                    stats["max_restart_notice_s"] = max(stats["max_restart_notice_s"], now - when)
                    pending_kills.remove((pid, when))
            stats["max_rss"] = max(stats["max_rss"], process.memory_info().rss)
            # Faults, each with the chance that gives it its mean period.
            elapsed = now - last
            if slow_left:
                slow_left -= 1
                stats["slow_batches"] += 1
                await anyio.sleep(10 * batch_time)
            elif rng.random() < elapsed / args.slow_every:
                slow_left = 5
            if rng.random() < elapsed / args.kill_every and not pending_kills:
                w = rng.randrange(args.workers)
                victim = collector.worker_pids[w]
                if victim is not None:
                    mid = rng.random() < 0.7
                    delay = rng.uniform(0, batch_time) if mid else 0.0
                    loop.call_later(delay, os.kill, victim, signal.SIGKILL)
                    pending_kills.append((victim, time.monotonic() + delay))
                    killed.add(victim)
                    stats["kills"] += 1
                    stats["kills_mid_batch"] += mid
                    if not mid:
                        await anyio.sleep(0.05)
            if rng.random() < elapsed / args.pause_every:
                async with collector.pause():
                    await anyio.sleep(rng.uniform(0.01, 0.3))
                stats["pauses"] += 1
            if rng.random() < elapsed / args.push_every:
                started = time.monotonic()
                value = float(rng.random() < 0.5)
                await collector.update_policy_weights_(Probe(value), timeout=30.0)
                accounts.weights[collector.policy_version] = value
                stats["max_push_s"] = max(stats["max_push_s"], time.monotonic() - started)
                stats["pushes"] += 1
            last = time.monotonic()
            batch = await anext(collector)
            if not slow_left:
                batch_time = 0.8 * batch_time + 0.2 * (time.monotonic() - last)
        accounts.saw(collector.worker_pids)
        dropped, restarts = collector.dropped_batches, collector.stats().restarts
    fds_end = len(os.listdir("/proc/self/fd"))
    accounts.versions(batch, [accounts.feed(w, batch[w]) for w in range(args.workers)])  # the batch received last
    frames_per_step = args.envs
    lost_steps: dict[int, int] = {}
    unfinished: dict[int, int] = {}
    for w in range(args.workers):
        if len(accounts.pids[w]) != len(accounts.incarnations[w]):
            accounts.errors.append(f"worker {w}: {len(accounts.pids[w])} processes, "
                                   f"{len(accounts.incarnations[w])} incarnations in the data")  # fmt: skip
            continue
        for pid, steps in zip(accounts.pids[w], accounts.incarnations[w], strict=True):
            (lost_steps if pid in killed else unfinished)[pid] = _steps_taken(ledger, pid) - steps
    errors = list(accounts.errors)
    # A killed worker loses at most the parts it was asked for: running ahead, the part it sent (its message dies
    # with it in its socket's queue) and the next one it began; each is a dropped batch.
    if any(v < 0 or v > 2 * n_steps for v in lost_steps.values()):
        errors.append(f"a killed worker lost more than the two parts it may hold: {lost_steps}")
    if sum(-(-v // n_steps) for v in lost_steps.values()) > dropped:
        errors.append(f"{sum(lost_steps.values())} steps lost in more parts than the {dropped} dropped batches")
    # A worker alive at the end may have begun the next batch ahead of the trainer (MultiSync collects
    # one batch ahead): shutdown ends that batch, and nothing else, undelivered.
    if any(v < 0 or v > n_steps for v in unfinished.values()):
        errors.append(f"a worker alive at the end collected more than the batch begun ahead: {unfinished}")
    if sum(1 for v in lost_steps.values() if v) > dropped:
        errors.append(f"{sum(1 for v in lost_steps.values() if v)} kills lost frames, {dropped} dropped batches")
    if restarts != stats["kills"]:
        errors.append(f"{stats['kills']} kills but {restarts} restarts")
    shutil.rmtree(ledger, ignore_errors=True)
    return {
        **stats,
        "minutes": args.minutes,
        "frames_collected": stats["batches"] * args.workers * args.envs * n_steps,
        "frames_lost": sum(lost_steps.values()) * frames_per_step,
        "kills_losing_frames": sum(1 for v in lost_steps.values() if v),
        "parts_losing_frames": sum(-(-v // n_steps) for v in lost_steps.values()),
        "dropped_batches": dropped,
        "restarts": restarts,
        "rss_start": rss_start,
        "fds_start": fds_start,
        "fds_end": fds_end,
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to collect (default 10)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--envs", type=int, default=4, help="envs per worker (default 4)")
    parser.add_argument("--steps", type=int, default=64, help="steps per worker batch (default 64)")
    parser.add_argument("--step-time", type=float, default=0.0002, help="seconds per env step (default 0.0002)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills (default 5)")
    parser.add_argument("--pause-every", type=float, default=7.0, help="mean seconds between pauses (default 7)")
    parser.add_argument("--push-every", type=float, default=1.0, help="mean seconds between pushes (default 1)")
    parser.add_argument("--slow-every", type=float, default=15.0, help="mean seconds between slow phases")
    parser.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.monotonic()
    result = anyio.run(soak, args)
    mib = 2**20
    print(f"soak: {result['minutes']:g} min ({time.monotonic() - started:.0f} s wall), {args.workers} workers x "
          f"{args.envs} envs, start method {args.start_method}, seed {args.seed}")  # fmt: skip
    print(f"  frames collected     {result['frames_collected']:,} in {result['batches']:,} batches")
    print(f"  frames lost          {result['frames_lost']:,}: in flight at {result['kills_losing_frames']} of "
          f"{result['kills']} kills ({result['kills_mid_batch']} mid-batch), in {result['parts_losing_frames']} "
          f"parts; dropped_batches = {result['dropped_batches']} (every part asked again)")  # fmt: skip
    print(f"  kills survived       {result['restarts']} restarts, each noticed within "
          f"{result['max_restart_notice_s']:.2f} s")  # fmt: skip
    print(f"  pauses               {result['pauses']}")
    print(f"  weight pushes        {result['pushes']}, slowest {result['max_push_s']:.3f} s")
    print(f"  slow-trainer batches {result['slow_batches']} (trainer sleeping 10x a batch)")
    print(f"  max RSS              {result['max_rss'] / mib:.0f} MiB (at start {result['rss_start'] / mib:.0f} MiB)")
    print(f"  open fds             {result['fds_start']} at start, {result['fds_end']} at end (after shutdown)")
    for error in result["errors"]:
        print(f"  CHECK FAILED: {error}")
    print("  checks: " + ("all passed" if not result["errors"] else f"{len(result['errors'])} failed"))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
