"""Soak test: collect for minutes while workers are killed or lost, envs raise, and the trainer pauses, pushes
weights and starves its workers.

Counting envs (each observation is its env's step counter, see ``acollect.testing``) run in worker processes that
keep a ledger of the steps they took (``benchmarks/_soak_ledger.py``), so every frame is accounted for: what the
trainer received is checked for gaps and duplicates as it arrives, and at the end each worker's ledger says how
many frames it collected that never arrived, to compare with the collector's counters. Phases, one after the
other, share ``--minutes`` (a third for the first, a sixth for each other):

1. **kills** (MultiSyncCollector, restarts on): at random moments (seeded), SIGKILL of a random worker (mid-batch
   or between batches), a ``pause()``, a weight push, and phases where the trainer sleeps ten times longer than a
   batch takes. Every frame's action is checked against the weights of the policy version it carries; each killed
   worker's lost frames (the batch in flight at the kill) against ``dropped_batches``.
2. **env faults** (MultiSyncCollector, ``env_errors="restart"``): every env raises at a random step of its life
   (``--fault-every`` steps on average) and is rebuilt in its worker. Each rebuild shows in the stream exactly where
   the env's ledger says its fault was, the frame before it ends its episodes (truncated), new trajectory ids
   follow, and ``env_restarts`` and the restart warnings equal the faults injected; no worker restarts.
3. **sub-env faults** (MultiSyncCollector, ``env_errors="restart"``): each worker steps a ``GymEnv`` over a plain
   ``SyncVectorEnv`` of counting sub-envs, each of which raises at a random step of its life (``--fault-every`` of
   its steps on average) and is rebuilt alone. Row by row: every frame is a real step that follows the one before
   it, episodes end terminated after exactly their length or truncated just before a rebuild, trajectory ids change
   only where an episode begins, to new ones; each rebuild shows in its row exactly where that sub-env's ledger says
   its fault was, in no other row; ``env_restarts``, the workers' warnings of a sub-env rebuilt alone and the
   trainer's count equal the faults injected, none rebuilt whole; no worker restarts.
4. **a worker lost** (MultiSyncCollector with one more worker, ``on_worker_loss="continue"``, no restarts): one
   worker is SIGKILLed once; batches go on with the parts of the others, ``lost_workers`` is 1, and the lost
   worker's frames are accounted for as a killed one's.
5. **whole episodes** (MultiAsyncCollector, ``trajs_per_batch``, with env faults and a worker lost): every
   episode handed out is whole (terminated after exactly its length) or truncated where a fault or the loss ended
   it; each worker's sub-env's episodes follow each other with nothing lost or repeated between them, rebuilds
   exactly where the faults were; the counters equal what was injected.

Prints what each phase saw (frames, faults, counters, max RSS and open file descriptors of the first); exits with
status 1 if any check failed.

Examples::

    python benchmarks/soak.py --minutes 2
    python benchmarks/soak.py --minutes 10 --workers 2 --kill-every 5 --seed 1
    python benchmarks/soak.py --minutes 1 --phases env-faults,episodes
    python benchmarks/soak.py --minutes 1.5 --phases sub-env-faults
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import torch
from _soak_ledger import (
    Accounts,
    Episodes,
    FaultyLedgerEnv,
    LedgerEnv,
    Probe,
    SubEnvAccounts,
    faults_injected,
    faulty_sub_envs,
    steps_taken,
    sub_env_steps,
    warnings_logged,
    worker_of,
)

from acollect import MultiAsyncCollector, MultiSyncCollector
from acollect._workers.handles import WorkerState


def _ledger_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="soak-ledger-"))


async def _trainer_turn(collector: Any, accounts: Accounts, rng: random.Random, elapsed: float,
                        args: argparse.Namespace, stats: dict[str, Any]) -> None:  # fmt: skip
    """The trainer's own faults between two batches, each with the chance that gives it its mean period: a pause
    (workers stop mid-batch and continue it after), a weight push."""
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


def _account_processes(accounts: Accounts, ledger: Path, killed: set[int], dropped: int,
                       n_steps: int) -> tuple[dict[int, int], list[str]]:  # fmt: skip
    """Each process's steps taken against those it delivered; returns the steps each killed one lost, and what
    failed."""
    lost_steps: dict[int, int] = {}
    unfinished: dict[int, int] = {}
    errors: list[str] = []
    for w in range(accounts.n_workers):
        if len(accounts.pids[w]) != len(accounts.incarnations[w]):
            errors.append(f"worker {w}: {len(accounts.pids[w])} processes, "
                          f"{len(accounts.incarnations[w])} incarnations in the data")  # fmt: skip
            continue
        for pid, steps in zip(accounts.pids[w], accounts.incarnations[w], strict=True):
            (lost_steps if pid in killed else unfinished)[pid] = steps_taken(ledger, pid) - steps
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
    return lost_steps, errors


class _RestartWarnings(logging.Handler):
    """Counts the trainer's warnings that a worker rebuilt its env, keeping them off stderr (one per restart: hundreds
    in a phase); every other record of the ``"acollect"`` logger shows as it would have."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.in_all = 0  # the restarts the last one counted in all

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("worker") and "rebuilt its env after it raised" in record.getMessage():
            self.count += 1
            self.in_all = int(record.getMessage().rsplit(": ", 1)[1].split()[0])
        else:
            sys.stderr.write(self.format(record) + "\n")

    def __enter__(self) -> _RestartWarnings:
        logging.getLogger("acollect").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("acollect").removeHandler(self)


async def _settled(read: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``read()`` once two reads 0.3 s apart agree (a worker reports its last env restarts with its next heartbeat,
    and one collecting ahead may still fault), or the last read after ``timeout`` seconds."""
    value = read()
    with anyio.move_on_after(timeout):
        while True:
            await anyio.sleep(0.3)
            value, before = read(), value
            if value == before:
                break
    return value


async def kills_phase(args: argparse.Namespace, seconds: float) -> tuple[list[str], list[str]]:
    """Kills, pauses, pushes and a slow trainer (MultiSyncCollector, restarts on). Returns what it saw, and what
    failed."""
    rng = random.Random(args.seed)
    ledger = _ledger_dir()
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
    deadline = time.monotonic() + seconds
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
            await _trainer_turn(collector, accounts, rng, elapsed, args, stats)
            last = time.monotonic()
            batch = await anext(collector)
            if not slow_left:
                batch_time = 0.8 * batch_time + 0.2 * (time.monotonic() - last)
        accounts.saw(collector.worker_pids)
        dropped, restarts = collector.dropped_batches, collector.stats().restarts
    fds_end = len(os.listdir("/proc/self/fd"))
    accounts.versions(batch, [accounts.feed(w, batch[w]) for w in range(args.workers)])  # the batch received last
    lost_steps, errors = _account_processes(accounts, ledger, killed, dropped, n_steps)
    errors = accounts.errors + errors
    if restarts != stats["kills"]:
        errors.append(f"{stats['kills']} kills but {restarts} restarts")
    shutil.rmtree(ledger, ignore_errors=True)
    mib = 2**20
    frames = stats["batches"] * args.workers * args.envs * n_steps
    losing = sum(1 for v in lost_steps.values() if v)
    parts = sum(-(-v // n_steps) for v in lost_steps.values())
    return [
        f"frames collected     {frames:,} in {stats['batches']:,} batches",
        f"frames lost          {sum(lost_steps.values()) * args.envs:,}: in flight at {losing} of {stats['kills']} "
        f"kills ({stats['kills_mid_batch']} mid-batch), in {parts} parts; dropped_batches = {dropped} (every part "
        "asked again)",
        f"kills survived       {restarts} restarts, each noticed within {stats['max_restart_notice_s']:.2f} s",
        f"pauses               {stats['pauses']}",
        f"weight pushes        {stats['pushes']}, slowest {stats['max_push_s']:.3f} s",
        f"slow-trainer batches {stats['slow_batches']} (trainer sleeping 10x a batch)",
        f"max RSS              {stats['max_rss'] / mib:.0f} MiB (at start {rss_start / mib:.0f} MiB)",
        f"open fds             {fds_start} at start, {fds_end} at end (after shutdown)",
    ], errors


async def env_faults_phase(args: argparse.Namespace, seconds: float) -> tuple[list[str], list[str]]:
    """Envs that raise now and then, rebuilt in their workers (MultiSyncCollector, ``env_errors="restart"``),
    with pauses and pushes."""
    rng = random.Random(args.seed + 1)
    ledger = _ledger_dir()
    n_steps = args.steps
    env = (FaultyLedgerEnv, str(ledger), args.envs, args.step_time, args.fault_every, args.seed)
    collector = MultiSyncCollector(
        [lambda: env[0](*env[1:])] * args.workers,
        Probe(0.0),
        frames_per_batch=args.workers * args.envs * n_steps,
        env_errors="restart",
        heartbeat_timeout=10.0,
        start_method=args.start_method,
    )
    accounts = Accounts(args.workers, rebuilds=True)
    stats: dict[str, Any] = {"pauses": 0, "pushes": 0, "max_push_s": 0.0, "batches": 0}
    deadline = time.monotonic() + seconds
    with _RestartWarnings() as told:
        async with collector:
            accounts.saw(collector.worker_pids)
            batch = await anext(collector)
            last = time.monotonic()
            while time.monotonic() < deadline:
                accounts.versions(batch, [accounts.feed(w, batch[w]) for w in range(args.workers)])
                accounts.saw(collector.worker_pids)
                stats["batches"] += 1
                await _trainer_turn(collector, accounts, rng, time.monotonic() - last, args, stats)
                last = time.monotonic()
                batch = await anext(collector)
            accounts.saw(collector.worker_pids)
            pids = [p for ps in accounts.pids for p in ps]

            def counters() -> tuple[int, int]:
                return collector.stats().env_restarts, sum(len(faults_injected(ledger, p)) for p in pids)

            restarts_reported, injected = await _settled(counters)
            final = collector.stats()
    accounts.versions(batch, [accounts.feed(w, batch[w]) for w in range(args.workers)])  # the batch received last
    _, errors = _account_processes(accounts, ledger, set(), final.dropped_batches, n_steps)
    errors = accounts.errors + errors
    seen = 0
    for w in range(args.workers):
        # One process per worker: a fault is the env's, never the worker's.
        faults = faults_injected(ledger, accounts.pids[w][0]) if len(accounts.pids[w]) == 1 else []
        delivered = [s for s in faults if s < accounts.delivered(w)]
        seen += len(accounts.rebuilt_at[w])
        if accounts.rebuilt_at[w] != delivered:
            errors.append(f"worker {w}: rebuilds at steps {accounts.rebuilt_at[w][:10]}, faults injected at "
                          f"{delivered[:10]} (of its {accounts.delivered(w)} steps delivered)")  # fmt: skip
    warned = sum(warnings_logged(ledger, p) for p in pids)
    if not restarts_reported == injected == warned == told.in_all:
        errors.append(f"{injected} faults injected, env_restarts = {restarts_reported}, {warned} warnings logged by "
                      f"the workers, {told.in_all} restarts told by the trainer's last warning")  # fmt: skip
    if (final.restarts, final.dropped_batches) != (0, 0):
        errors.append(f"env faults restarted workers ({final.restarts}) or dropped batches ({final.dropped_batches})")
    shutil.rmtree(ledger, ignore_errors=True)
    frames = stats["batches"] * args.workers * args.envs * n_steps
    return [
        f"frames collected     {frames:,} in {stats['batches']:,} batches",
        f"env faults           {injected} injected (every {args.fault_every} steps of an env's life on average), "
        f"env_restarts = {restarts_reported}, {warned} warnings in the workers ({told.count} in the trainer); {seen} "
        "rebuilds in the frames delivered, each where its fault was",
        f"pauses, pushes       {stats['pauses']}, {stats['pushes']} (slowest {stats['max_push_s']:.3f} s); "
        f"restarts {final.restarts}, dropped_batches {final.dropped_batches}",
    ], errors


async def sub_env_faults_phase(args: argparse.Namespace, seconds: float) -> tuple[list[str], list[str]]:
    """Sub-envs of ``GymEnv`` vector envs that raise now and then, each rebuilt alone in its worker while its
    neighbours step on (MultiSyncCollector, ``env_errors="restart"``), with pauses and pushes."""
    rng = random.Random(args.seed + 4)
    ledger = _ledger_dir()
    n_steps = args.steps
    lengths = [29 + 8 * i for i in range(args.envs)]
    # The sleep is per batched step, as the other phases' envs take it: a sub-env takes its share.
    make = functools.partial(faulty_sub_envs, str(ledger), lengths, args.step_time / args.envs, args.fault_every,
                             args.seed)  # fmt: skip
    collector = MultiSyncCollector(
        [make] * args.workers,
        Probe(0.0),
        frames_per_batch=args.workers * args.envs * n_steps,
        env_errors="restart",
        heartbeat_timeout=10.0,
        start_method=args.start_method,
    )
    accounts = Accounts(args.workers)  # the policy versions and pushes only: the rows are SubEnvAccounts'
    rows = SubEnvAccounts(args.workers, lengths)
    stats: dict[str, Any] = {"pauses": 0, "pushes": 0, "max_push_s": 0.0, "batches": 0}
    deadline = time.monotonic() + seconds

    def feed(batch: Any) -> None:
        accounts.versions(batch, [False] * args.workers)
        for w in range(args.workers):
            rows.feed(w, batch[w])

    with _RestartWarnings() as told:
        async with collector:
            accounts.saw(collector.worker_pids)
            batch = await anext(collector)
            last = time.monotonic()
            while time.monotonic() < deadline:
                feed(batch)
                accounts.saw(collector.worker_pids)
                stats["batches"] += 1
                await _trainer_turn(collector, accounts, rng, time.monotonic() - last, args, stats)
                last = time.monotonic()
                batch = await anext(collector)
            accounts.saw(collector.worker_pids)
            pids = [p for ps in accounts.pids for p in ps]

            def counters() -> tuple[int, int]:
                injected = sum(len(faults_injected(ledger, p, sub)) for p in pids for sub in range(args.envs))
                return collector.stats().env_restarts, injected

            restarts_reported, injected = await _settled(counters)
            final = collector.stats()
    feed(batch)  # the batch received last
    errors = accounts.errors + rows.errors
    if any(len(ps) != 1 for ps in accounts.pids):
        # A fault is a sub-env's, never its worker's: one process per worker all along.
        errors.append(f"worker processes {accounts.pids}")
        return [], errors
    faults = {(w, sub): faults_injected(ledger, ps[0], sub) for w, ps in enumerate(accounts.pids)
              for sub in range(args.envs)}  # fmt: skip
    errors += rows.check(faults)
    # Each row's steps taken against those delivered: a worker may have begun the next batch ahead of the trainer
    # (MultiSync collects one batch ahead), which shutdown ends undelivered; nothing else is missing.
    ahead = {(w, sub): sub_env_steps(ledger, ps[0], sub) - rows.delivered[w] for w, ps in enumerate(accounts.pids)
             for sub in range(args.envs)}  # fmt: skip
    if any(v < 0 or v > n_steps for v in ahead.values()):
        errors.append(f"steps taken but not delivered, per worker and sub-env, beyond 0..{n_steps}: {ahead}")
    alone = sum(warnings_logged(ledger, p, alone=True) for p in pids)
    whole = sum(warnings_logged(ledger, p) for p in pids)
    if not restarts_reported == injected == alone == told.in_all or whole:
        errors.append(f"{injected} faults injected, env_restarts = {restarts_reported}, {alone} warnings of a sub-env "
                      f"rebuilt alone and {whole} of an env rebuilt whole logged by the workers, {told.in_all} "
                      "restarts told by the trainer's last warning")  # fmt: skip
    if (final.restarts, final.dropped_batches) != (0, 0):
        errors.append(f"faults restarted workers ({final.restarts}) or dropped batches ({final.dropped_batches})")
    if not injected:
        errors.append("no fault injected: nothing was checked")
    shutil.rmtree(ledger, ignore_errors=True)
    frames = stats["batches"] * args.workers * args.envs * n_steps
    return [
        f"frames collected     {frames:,} in {stats['batches']:,} batches, {args.workers} workers x {args.envs} "
        "sub-envs of a GymEnv (SyncVectorEnv)",
        f"sub-env faults       {injected} injected (every {args.fault_every} steps of a sub-env's life on average), "
        f"env_restarts = {restarts_reported}, {alone} warnings of a sub-env rebuilt alone in the workers ({whole} "
        f"rebuilt whole; {told.count} in the trainer)",
        f"episodes cut         {rows.rebuilds()} rebuilds in the frames delivered, each where its fault was and in "
        f"its row only: {rows.cut} episodes truncated at their last step, {rows.after_end} right after an episode's "
        f"end, {rows.at_first_frame} at a batch's first frame (ended by the new trajectory id)",
        f"pauses, pushes       {stats['pauses']}, {stats['pushes']} (slowest {stats['max_push_s']:.3f} s); "
        f"restarts {final.restarts}, dropped_batches {final.dropped_batches}",
    ], errors


class _Loss:
    """One worker SIGKILLed once, at a random moment of the phase (a fifth to half-way), and when it was noticed."""

    def __init__(self, rng: random.Random, n_workers: int, seconds: float) -> None:
        self.worker = rng.randrange(n_workers)
        self.at = time.monotonic() + rng.uniform(0.2, 0.5) * seconds
        self.pid: int | None = None
        self.killed_at: float | None = None
        self.notice_s: float | None = None

    def step(self, collector: Any) -> None:
        """Kills the worker once its moment came; notes when the collector counts it lost."""
        now = time.monotonic()
        if self.killed_at is None and now >= self.at:
            self.pid = collector.worker_pids[self.worker]
            assert self.pid is not None
            os.kill(self.pid, signal.SIGKILL)
            self.killed_at = now
        elif self.killed_at is not None and self.notice_s is None and collector.stats().lost_workers:
            self.notice_s = now - self.killed_at

    @property
    def noticed(self) -> bool:
        return self.notice_s is not None


def _loss_checks(collector: Any, loss: _Loss, n_workers: int) -> list[str]:
    errors = []
    stats = collector.stats()
    if loss.killed_at is None:
        errors.append("the phase ended before its worker was killed")
    elif (stats.lost_workers, stats.restarts) != (1, 0):
        errors.append(f"one worker killed for good: lost_workers = {stats.lost_workers}, restarts = {stats.restarts}")
    elif collector.worker_states[loss.worker] is not WorkerState.LOST:
        errors.append(f"worker {loss.worker} shows {collector.worker_states[loss.worker]}, not LOST")
    return errors


async def lost_worker_phase(args: argparse.Namespace, seconds: float) -> tuple[list[str], list[str]]:
    """One worker lost for good (MultiSyncCollector, ``on_worker_loss="continue"``, no restarts): batches go on
    with the others' parts, with pauses and pushes."""
    rng = random.Random(args.seed + 2)
    ledger = _ledger_dir()
    n_steps, n_workers = args.steps, args.workers + 1
    env = (LedgerEnv, str(ledger), args.envs, args.step_time)
    collector = MultiSyncCollector(
        [lambda: env[0](*env[1:])] * n_workers,
        Probe(0.0),
        frames_per_batch=n_workers * args.envs * n_steps,
        max_worker_restarts=0,
        on_worker_loss="continue",
        heartbeat_timeout=10.0,
        start_method=args.start_method,
    )
    accounts = Accounts(n_workers)
    stats: dict[str, Any] = {"pauses": 0, "pushes": 0, "max_push_s": 0.0, "batches": 0, "after": 0,
                             "lost_parts_after": 0}  # fmt: skip
    loss = _Loss(rng, n_workers, seconds)
    deadline = time.monotonic() + seconds

    def feed(batch: Any) -> None:
        workers = [worker_of(part, n_workers) for part in batch]
        if workers != sorted(set(workers)):
            accounts.errors.append(f"a batch's parts are not one per worker, in order: {workers}")
        accounts.versions(batch, [accounts.feed(w, part) for w, part in zip(workers, batch, strict=True)])
        if loss.noticed:
            stats["after"] += 1
            stats["lost_parts_after"] += loss.worker in workers

    async with collector:
        accounts.saw(collector.worker_pids)
        batch = await anext(collector)
        last = time.monotonic()
        while time.monotonic() < deadline:
            feed(batch)
            accounts.saw(collector.worker_pids)
            stats["batches"] += 1
            loss.step(collector)
            await _trainer_turn(collector, accounts, rng, time.monotonic() - last, args, stats)
            last = time.monotonic()
            batch = await anext(collector)
        errors = _loss_checks(collector, loss, n_workers)
        dropped = collector.dropped_batches
    feed(batch)  # the batch received last
    killed = {loss.pid} if loss.pid is not None else set()
    lost_steps, account_errors = _account_processes(accounts, ledger, killed, dropped, n_steps)
    errors = accounts.errors + account_errors + errors
    # Its parts delivered before its death may still make the next two batches (it collects one ahead); none after.
    if stats["lost_parts_after"] > 2:
        errors.append(f"{stats['lost_parts_after']} batches after the loss hold a part of the lost worker")
    if stats["after"] < 2:
        errors.append(f"the collector did not go on after the loss ({stats['after']} batches)")
    shutil.rmtree(ledger, ignore_errors=True)
    notice = f"{loss.notice_s:.2f} s" if loss.notice_s is not None else "never"
    return [
        f"batches              {stats['batches']:,}, {stats['after']:,} of them after the loss, of the parts of "
        f"{n_workers - 1} workers",
        f"worker lost          worker {loss.worker} (of {n_workers}), noticed in {notice}; "
        f"{sum(lost_steps.values()) * args.envs:,} frames in flight lost, dropped_batches = {dropped}",
        f"pauses, pushes       {stats['pauses']}, {stats['pushes']} (slowest {stats['max_push_s']:.3f} s)",
    ], errors


async def episodes_phase(args: argparse.Namespace, seconds: float) -> tuple[list[str], list[str]]:
    """Whole episodes (MultiAsyncCollector, ``trajs_per_batch``) from envs that raise now and then, and a worker
    lost for good."""
    rng = random.Random(args.seed + 3)
    ledger = _ledger_dir()
    n_steps, n_workers, n_trajs = args.steps, args.workers + 1, args.trajs
    lengths = [29 + 8 * i for i in range(args.envs)]  # padded to the longest in each batch
    env = (FaultyLedgerEnv, str(ledger), args.envs, args.step_time, args.fault_every, args.seed, lengths)
    collector = MultiAsyncCollector(
        [lambda: env[0](*env[1:])] * n_workers,
        Probe(0.0),
        frames_per_batch=args.envs * n_steps,
        trajs_per_batch=n_trajs,
        env_errors="restart",
        max_worker_restarts=0,
        on_worker_loss="continue",
        heartbeat_timeout=10.0,
        start_method=args.start_method,
    )
    episodes = Episodes(n_workers, lengths)
    loss = _Loss(rng, n_workers, seconds)
    batches = after = 0
    deadline = time.monotonic() + seconds
    with _RestartWarnings() as told:
        async with collector:
            batch = await anext(collector)
            pids: list[int] = [p for p in collector.worker_pids if p is not None]
            while time.monotonic() < deadline:
                episodes.feed(batch)
                batches += 1
                after += loss.noticed
                loss.step(collector)
                batch = await anext(collector)
            errors = _loss_checks(collector, loss, n_workers)

            def counters() -> tuple[int, int]:
                return collector.stats().env_restarts, sum(len(faults_injected(ledger, p)) for p in pids)

            restarts_reported, injected = await _settled(counters)
            credits = collector.credits or 0
    episodes.feed(batch)  # the batch received last
    errors = episodes.errors + errors
    if len(pids) != n_workers:
        errors.append(f"worker pids {pids}")
        return [], errors
    faults = {w: faults_injected(ledger, pid) for w, pid in enumerate(pids)}
    errors += episodes.check(faults, loss.worker if loss.pid is not None else None)
    # What each sub-env collected and was not handed out (all its frames before it were: no gap above): for a live
    # worker, the batches it collected ahead, its episode in progress and complete ones waiting for a batch of
    # their own; for the lost one, the batches it held when it died (its episodes in progress were cut).
    bound = (credits + 1) * n_steps + n_trajs * max(lengths)
    tails = {(w, sub): steps_taken(ledger, pids[w]) - episodes.handed_out(w, sub)
             for w in range(n_workers) for sub in range(args.envs)}  # fmt: skip
    lost_tails = {sub: tail for (w, sub), tail in tails.items() if w == loss.worker}
    if any(t < 0 or t > bound for t in tails.values()):
        errors.append(f"frames collected but not handed out, per worker and sub-env, beyond 0..{bound}: {tails}")
    if len(set(lost_tails.values())) > 1 or max(lost_tails.values()) > (credits + 1) * n_steps:
        errors.append(f"the lost worker's frames not handed out: {lost_tails} (its episodes were to be cut)")
    # The lost worker's faults after its last frame handed out may have died with it before its next report.
    unreported = len([s for s in faults[loss.worker] if s >= min(episodes.handed_out(loss.worker, sub)
                                                                  for sub in range(args.envs))])  # fmt: skip
    if not injected - unreported <= restarts_reported <= injected or told.in_all != restarts_reported:
        counted = f"env_restarts = {restarts_reported}, {told.in_all} in the trainer's warnings"
        errors.append(f"{injected} faults injected ({unreported} by the lost worker after its last frame), {counted}")
    for w, pid in enumerate(pids):
        warned, injected_w = warnings_logged(ledger, pid), len(faults[w])
        if warned != injected_w and not (w == loss.worker and warned == injected_w - 1):
            errors.append(f"worker {w}: {injected_w} faults injected, {warned} warnings logged")
    if after < 2:
        errors.append(f"no whole episodes after the loss ({after} batches)")
    shutil.rmtree(ledger, ignore_errors=True)
    notice = f"{loss.notice_s:.2f} s" if loss.notice_s is not None else "never"
    return [
        f"episodes             {episodes.count:,} whole or truncated ({episodes.truncated():,} truncated), "
        f"{episodes.frames:,} frames, in {batches:,} batches of {n_trajs}",
        f"env faults           {injected} injected, env_restarts = {restarts_reported}",
        f"worker lost          worker {loss.worker} (of {n_workers}), noticed in {notice}; {after:,} batches after",
        f"not handed out       at most {max(tails.values()):,} frames of a sub-env (episodes in progress, batches "
        f"ahead; bound {bound:,}), {max(lost_tails.values()):,} of the lost worker's (in flight at its death)",
    ], errors


#: The phases, in order, with their share of ``--minutes``.
PHASES: dict[str, tuple[float, Callable[[argparse.Namespace, float], Awaitable[tuple[list[str], list[str]]]]]] = {
    "kills": (2 / 6, kills_phase),
    "env-faults": (1 / 6, env_faults_phase),
    "sub-env-faults": (1 / 6, sub_env_faults_phase),
    "lost-worker": (1 / 6, lost_worker_phase),
    "episodes": (1 / 6, episodes_phase),
}


async def soak(args: argparse.Namespace, phases: list[str]) -> list[str]:
    """Runs ``phases`` one after the other, printing what each saw; returns what failed."""
    share = sum(PHASES[name][0] for name in phases)
    failed: list[str] = []
    for name in phases:
        weight, phase = PHASES[name]
        seconds = 60 * args.minutes * weight / share
        started = time.monotonic()
        lines, errors = await phase(args, seconds)
        print(f"{name} ({seconds:.0f} s, {time.monotonic() - started:.0f} s wall):", flush=True)
        for line in lines:
            print(f"  {line}")
        for error in errors[:20]:  # one broken rule can fail every later check of its stream: the first say why
            print(f"  CHECK FAILED: {error}")
        if len(errors) > 20:
            print(f"  ... and {len(errors) - 20} more")
        print("  checks: " + ("all passed" if not errors else f"{len(errors)} failed"), flush=True)
        failed += [f"{name}: {error}" for error in errors]
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to collect, all phases (default 10)")
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"which phases, in order (default {','.join(PHASES)})"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2; one more in the phases "
                        "that lose one)")  # fmt: skip
    parser.add_argument("--envs", type=int, default=4, help="envs per worker (default 4)")
    parser.add_argument("--steps", type=int, default=64, help="steps per worker batch (default 64)")
    parser.add_argument("--step-time", type=float, default=0.0002, help="seconds per env step (default 0.0002)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills (default 5)")
    parser.add_argument("--pause-every", type=float, default=7.0, help="mean seconds between pauses (default 7)")
    parser.add_argument("--push-every", type=float, default=1.0, help="mean seconds between pushes (default 1)")
    parser.add_argument("--slow-every", type=float, default=15.0, help="mean seconds between slow phases")
    parser.add_argument("--fault-every", type=int, default=400, help="mean steps of an env's (or a sub-env's) life "
                        "before it raises (default 400)")  # fmt: skip
    parser.add_argument("--trajs", type=int, default=8, help="episodes per batch of whole episodes (default 8)")
    parser.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        parser.error(f"--phases: unknown {unknown}, expected some of {list(PHASES)}")
    torch.set_num_threads(1)
    started = time.monotonic()
    print(f"soak: {args.minutes:g} min, phases {', '.join(phases)}; {args.workers} workers x {args.envs} envs, "
          f"start method {args.start_method}, seed {args.seed}", flush=True)  # fmt: skip
    failed = anyio.run(soak, args, phases)
    print(f"soak: {time.monotonic() - started:.0f} s wall; checks: "
          + ("all passed" if not failed else f"{len(failed)} failed"))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
