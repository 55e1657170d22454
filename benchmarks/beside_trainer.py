"""Collection beside a busy trainer: what each collector leaves the trainer, and what it collects meanwhile.

The set-up of an off-policy trainer on one host: ``collector.start(replay_buffer=rb)`` fills an
:class:`acollect.ReplayBuffer` in the background while the main task trains on samples of it, one DQN step after
another (a ``4 -> H -> H -> 2`` Q-network, forward and backward on ``--sample`` transitions, Adam; one torch
thread), with ``await asyncio.sleep(0)`` between steps as docs/background.md asks.

Each turn of a contender has two timed phases, their order alternating round by round:

* **alone**: the main task only sleeps; the contender's frames/s is its rate with the host to itself;
* **beside the trainer**: the main task trains for as long; the trainer's steps/s and the contender's frames/s.

Contenders, the order rotating every round so that a change in the machine's load hits all alike:

* ``trainer-alone``: the trainer on a buffer filled beforehand, nothing collecting (its steps/s is the reference
  for every other contender's trainer);
* ``bare-process``: this machine's limit: one separate process running the hand loop of the other benchmarks
  (``SyncVectorEnv`` of ``--envs`` CartPole envs and the same policy, batch after batch) with no communication at
  all, beside the same trainer on a buffer filled beforehand;
* ``Collector``: in-process, ``--envs`` envs, ``--frames-per-batch`` frames per batch;
* ``MultiSyncCollector-N`` / ``MultiAsyncCollector-N``: ``N`` workers of ``--envs`` envs each, every worker
  collecting ``--frames-per-batch`` frames per batch; ``N`` runs over 1, the default ``num_workers`` and the usable
  cores (whichever differ), the default one marked.

The ratios: each contender's trainer steps/s against ``trainer-alone``'s, and its frames/s beside the trainer against
its own alone (``kept``) and against the bare process's beside the trainer, medians of the rounds' ratios.

``--hold-ms MS`` replaces the trainer's step with ``time.sleep(MS / 1000)``: the event loop is held as long as a step
holds it, but no core is taken, so what is left of the collectors' loss is the loop's share alone (the bare process
is then unaffected by construction). The *busy* column, the share of the time each collecting process's busiest
thread ran or waited for a core (Linux's schedstat), says how long the workers sat blocked, waiting for the trainer's
loop to hand their batch over and send a credit or request back; unlike frames/s, other jobs' load does not move it.

``--part threads`` measures instead the in-process ``Collector``'s sensitivity to torch's intra-op threads: the
collector alone with torch's default thread count and with ``torch.set_num_threads(1)``, on a quiet host and beside
another busy process (a pure-Python spinner, one per core but one), in turns.

    python benchmarks/beside_trainer.py --json docs/data/beside-trainer.json
    python benchmarks/beside_trainer.py --part threads --json docs/data/beside-trainer-threads.json

Run ``python benchmarks/beside_trainer.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import ENV_ID, CleanRLLoop, machine_info, make_policy, median, write_json

from acollect import Collector, GymEnv, MultiAsyncCollector, MultiSyncCollector, ReplayBuffer
from acollect.testing import wait_until


class Trainer:
    """One DQN step after another on samples of a replay buffer: a CPU trainer of a few milliseconds a step."""

    def __init__(self, hidden: int, sample: int, hold_ms: float = 0.0) -> None:
        self.q = torch.nn.Sequential(
            torch.nn.Linear(4, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 2),
        )
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-4)
        self.sample = sample
        self.hold_s = hold_ms / 1e3

    def step(self, rb: ReplayBuffer) -> None:
        if self.hold_s:  # the loop held as long as a step, without a core: the loop's share of the cost alone
            time.sleep(self.hold_s)
            return
        data = rb.sample(self.sample)
        observation = data["observation"].float()
        q = self.q(observation).gather(-1, data["action"].long().reshape(-1, 1))
        with torch.no_grad():
            best_next = self.q(data["next", "observation"].float()).max(-1, keepdim=True).values
            target = data["next", "reward"].reshape(-1, 1) + 0.99 * best_next
        loss = torch.nn.functional.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    async def train(self, rb: ReplayBuffer, seconds: float) -> tuple[int, list[float]]:
        """Steps for ``seconds``, yielding to the loop between steps; returns the steps and each one's seconds."""
        times: list[float] = []
        end = time.perf_counter() + seconds
        while (now := time.perf_counter()) < end:
            self.step(rb)
            times.append(time.perf_counter() - now)
            await asyncio.sleep(0)  # as docs/background.md asks of a trainer
        return len(times), times


def _bare_process(num_envs: int, frames_per_batch: int, frames: Any, go: Any, stop: Any) -> None:  # pragma: no cover
    """The hand loop in a process of its own, counting its frames in ``frames`` while ``go`` is set."""
    torch.set_num_threads(1)  # as in a collector's workers
    loop = CleanRLLoop(num_envs, frames_per_batch)
    loop.collect_batch()
    frames.value = -1  # ready
    while not stop.is_set():
        if not go.wait(0.1):
            continue
        n = loop.collect_batch()
        with frames.get_lock():
            frames.value += n
    loop.close()


class BareProcess:
    """This machine's limit: the hand loop in a separate process, no communication but a frame counter."""

    def __init__(self, num_envs: int, frames_per_batch: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._frames = ctx.Value("q", 0)
        self._go, self._stop = ctx.Event(), ctx.Event()
        self._process = ctx.Process(
            target=_bare_process, args=(num_envs, frames_per_batch, self._frames, self._go, self._stop), daemon=True
        )

    @property
    def frames(self) -> int:
        return max(0, int(self._frames.value))

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    async def __aenter__(self) -> BareProcess:
        self._process.start()
        await wait_until(lambda: self._frames.value == -1 or not self._process.is_alive(), timeout=120)
        if not self._process.is_alive():
            raise RuntimeError(f"the bare env process died at its start (exit code {self._process.exitcode})")
        self._frames.value = 0
        self._go.set()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        self._go.set()
        await asyncio.to_thread(self._process.join, 10)
        if self._process.is_alive():
            self._process.kill()
            await asyncio.to_thread(self._process.join, 5)


def _wanting_cpu_s(pids: list[int]) -> dict[tuple[int, int], float]:
    """Seconds each thread of ``pids`` ran or sat runnable waiting for a core (Linux's schedstat; ``{}`` elsewhere).

    What is left of a span is the time a thread was blocked: for a collecting thread, waiting for the trainer (a
    credit, a request). Unlike frames/s, this share does not move with other jobs' load on the cores.
    """
    out: dict[tuple[int, int], float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run_ns, wait_ns, _ = f.read().split()
            except (OSError, ValueError):
                continue
            out[(pid, int(tid))] = (int(run_ns) + int(wait_ns)) / 1e9
    return out


def _busy_share(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float], wall: float) -> float:
    """The busiest collecting thread's share of ``wall`` spent running or runnable, per process, averaged."""
    per_process: dict[int, float] = {}
    for key, seconds in after.items():
        share = (seconds - before.get(key, 0.0)) / wall
        per_process[key[0]] = max(per_process.get(key[0], 0.0), share)
    return statistics.fmean(per_process.values()) if per_process else float("nan")


def _env(num_envs: int) -> Any:
    return functools.partial(GymEnv, ENV_ID, num_envs=num_envs)


def _filled(args: argparse.Namespace) -> ReplayBuffer:
    """A buffer of real transitions, for the contenders that fill none (one batch of the in-process loop)."""
    rb = ReplayBuffer(capacity=args.capacity)

    async def fill() -> None:
        async with Collector(_env(args.envs), make_policy(), frames_per_batch=4 * args.frames_per_batch) as c:
            rb.extend(await anext(c))

    asyncio.run(fill())
    return rb


@contextlib.asynccontextmanager
async def _contender(kind: str, args: argparse.Namespace, filled: ReplayBuffer) -> AsyncIterator[Any]:
    """Starts ``kind``; yields ``(buffer, frames so far, collecting processes)`` once it collects (start-up and
    first batches untimed)."""
    if kind == "trainer-alone":
        yield filled, lambda: 0, []
        return
    if kind == "bare-process":
        async with BareProcess(args.envs, args.frames_per_batch) as bare:
            await asyncio.sleep(args.warmup)
            yield filled, lambda: bare.frames, [bare.pid]
        return
    name, _, workers = kind.partition("-")
    if name == "Collector":
        collector: Any = Collector(
            _env(args.envs), make_policy(), frames_per_batch=args.frames_per_batch, total_frames=-1
        )
    else:
        n = int(workers)
        per = args.frames_per_batch * (n if name == "MultiSyncCollector" else 1)  # each worker's part the same
        cls = MultiSyncCollector if name == "MultiSyncCollector" else MultiAsyncCollector
        collector = cls(_env(args.envs), make_policy(), num_workers=n, frames_per_batch=per, total_frames=-1)
    rb = ReplayBuffer(capacity=args.capacity)
    async with collector:
        collector.start(replay_buffer=rb)
        await wait_until(lambda: len(rb) >= 4 * args.frames_per_batch, timeout=120)
        await asyncio.sleep(args.warmup)
        pids = [] if name == "Collector" else [pid for pid in collector.worker_pids if pid is not None]
        yield rb, lambda: collector.frames, pids
        await collector.async_shutdown()


async def _turn(kind: str, args: argparse.Namespace, filled: ReplayBuffer, trainer_first: bool) -> dict[str, Any]:
    trainer = Trainer(args.hidden, args.sample, args.hold_ms)
    async with _contender(kind, args, filled) as (rb, frames, pids):
        out: dict[str, Any] = {}
        for phase in ("beside", "alone") if trainer_first else ("alone", "beside"):
            before, started = frames(), time.perf_counter()
            cpu, wanting = time.process_time(), _wanting_cpu_s(pids)
            if phase == "alone":
                await asyncio.sleep(args.seconds)
            else:
                steps, times = await trainer.train(rb, args.seconds)
                out["trainer_steps_per_s"] = steps / (time.perf_counter() - started)
                out["step_ms_median"] = median(times) * 1e3
            wall = time.perf_counter() - started
            out[f"{phase}_frames_per_s"] = (frames() - before) / wall
            out[f"{phase}_trainer_process_cores"] = (time.process_time() - cpu) / wall
            out[f"{phase}_collecting_busy"] = _busy_share(wanting, _wanting_cpu_s(pids), wall)
    out["loadavg"] = os.getloadavg()[0]
    return out


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _kinds(args: argparse.Namespace) -> tuple[list[str], int]:
    # The collector's own default, read from one built and never entered (no process starts).
    default = MultiSyncCollector(_env(args.envs), make_policy(), frames_per_batch=args.frames_per_batch).num_workers
    counts = sorted({1, default, _usable_cores()})
    kinds = ["trainer-alone", "bare-process", "Collector"]
    kinds += [f"{cls}-{n}" for cls in ("MultiSyncCollector", "MultiAsyncCollector") for n in counts]
    if args.only:
        kinds = [k for k in kinds if k in args.only.split(",")]
    return kinds, default


def _ratio(xs: list[float], ys: list[float]) -> float:
    pairs = [x / y for x, y in zip(xs, ys, strict=False) if y > 0]
    return median(pairs)


def beside(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    kinds, default = _kinds(args)
    filled = _filled(args)
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        for kind in order:
            result = asyncio.run(_turn(kind, args, filled, trainer_first=r % 2 == 1))
            rounds[kind].append(result)
            print(
                f"round {r + 1}/{args.rounds} {kind:<24} trainer {result['trainer_steps_per_s']:>6,.0f} steps/s "
                f"(step {result['step_ms_median']:.2f} ms); frames/s alone {result['alone_frames_per_s']:>8,.0f}, "
                f"beside {result['beside_frames_per_s']:>8,.0f}; load average {result['loadavg']:.1f}",
                flush=True,
            )
    summary: dict[str, dict[str, float]] = {}
    trainer_ref = [r["trainer_steps_per_s"] for r in rounds.get("trainer-alone", [])]
    bare_ref = [r["beside_frames_per_s"] for r in rounds.get("bare-process", [])]
    for kind, results in rounds.items():
        steps = [r["trainer_steps_per_s"] for r in results]
        alone = [r["alone_frames_per_s"] for r in results]
        near = [r["beside_frames_per_s"] for r in results]
        summary[kind] = {
            "trainer_steps_per_s": median(steps),
            "trainer_vs_alone": _ratio(steps, trainer_ref),
            "frames_per_s_alone": median(alone),
            "frames_per_s_beside": median(near),
            "kept": _ratio(near, alone),
            "frames_vs_bare": _ratio(near, bare_ref),
            "step_ms": median([r["step_ms_median"] for r in results]),
            "busy_alone": median([r["alone_collecting_busy"] for r in results]),
            "busy_beside": median([r["beside_collecting_busy"] for r in results]),
        }
    print(
        f"\n{'contender':<34}{'trainer/s':>10}{'x alone':>9}{'frames/s alone':>16}{'beside':>10}{'kept':>7}"
        f"{'x bare':>8}{'busy alone':>12}{'beside':>8}"
    )
    for kind, s in summary.items():
        label = kind + (" (default)" if kind.endswith(f"Collector-{default}") else "")
        print(
            f"{label:<34}{s['trainer_steps_per_s']:>10,.0f}{s['trainer_vs_alone']:>9.2f}"
            f"{s['frames_per_s_alone']:>16,.0f}{s['frames_per_s_beside']:>10,.0f}{s['kept']:>7.2f}"
            f"{s['frames_vs_bare']:>8.2f}{s['busy_alone']:>12.2f}{s['busy_beside']:>8.2f}"
        )
    print(
        "busy: the share of the time each collecting process's busiest thread ran or waited for a core (the rest "
        "it was blocked: waiting for the trainer); load-independent, unlike frames/s"
    )
    return {"default_num_workers": default, "usable_cores": _usable_cores(), "rounds": rounds, "summary": summary}


@contextlib.contextmanager
def _spinners(n: int) -> Iterator[None]:
    """``n`` busy processes (pure Python, no torch): another job on the host."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        stop.set()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


def _spin(stop: Any) -> None:  # pragma: no cover - runs in the child processes
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


async def _threads_turn(threads: int, args: argparse.Namespace) -> float:
    torch.set_num_threads(threads)  # the collection thread takes the caller's count when the collector starts
    async with Collector(
        _env(args.envs), make_policy(), frames_per_batch=args.frames_per_batch, total_frames=-1
    ) as collector:
        await anext(collector)  # started, and the torch threads spun up
        frames, started = collector.frames, time.perf_counter()
        end = started + args.seconds
        while time.perf_counter() < end:
            await anext(collector)
        return (collector.frames - frames) / (time.perf_counter() - started)


def threads(args: argparse.Namespace) -> dict[str, Any]:
    default = torch.get_num_threads()
    counts = sorted({default, 1}, reverse=True)
    others = max(1, _usable_cores() - 1)
    rates: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for busy in (False, True) if r % 2 == 0 else (True, False):
            with _spinners(others) if busy else contextlib.nullcontext():
                if busy:
                    time.sleep(0.5)  # the spinners running
                for n in counts if r % 2 == 0 else counts[::-1]:
                    rate = asyncio.run(_threads_turn(n, args))
                    key = f"threads={n}, {'beside a busy process' if busy else 'alone'}"
                    rates.setdefault(key, []).append(rate)
                    print(
                        f"round {r + 1}/{args.rounds} {key:<36} {rate:>8,.0f} frames/s (load average "
                        f"{os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    torch.set_num_threads(default)
    summary = {key: {"median": median(xs), "min": min(xs), "max": max(xs)} for key, xs in rates.items()}
    print(f"\n{'in-process Collector':<38}{'median':>10}{'min':>10}{'max':>10}  frames/s")
    for key, s in summary.items():
        print(f"{key:<38}{s['median']:>10,.0f}{s['min']:>10,.0f}{s['max']:>10,.0f}")
    return {"torch_default_threads": default, "busy_processes": others, "rounds": rates, "summary": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--part", choices=("beside", "threads"), default="beside")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of each timed phase")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=0.5, help="untimed seconds of collection before timing")
    parser.add_argument("--envs", type=int, default=8, help="CartPole envs per worker (or process)")
    parser.add_argument("--frames-per-batch", type=int, default=256, help="frames of each worker's batch")
    parser.add_argument("--hidden", type=int, default=256, help="the trainer's Q-network width")
    parser.add_argument("--sample", type=int, default=256, help="transitions per trainer step")
    parser.add_argument(
        "--hold-ms",
        type=float,
        default=0.0,
        help="instead of training, each step holds the event loop this long with time.sleep, using no core: what "
        "the loop's unavailability alone costs the collectors (0: train)",
    )
    parser.add_argument("--capacity", type=int, default=100_000, help="replay buffer capacity (transitions)")
    parser.add_argument("--only", default="", help="contenders, comma-separated (default: all)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    machine = machine_info()
    result = beside(args) if args.part == "beside" else threads(args)
    payload = {
        "benchmark": f"beside_trainer/{args.part}",
        "env": ENV_ID,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine,
        **result,
    }
    if args.json is not None:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
