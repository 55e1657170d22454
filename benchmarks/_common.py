"""Shared pieces of the benchmark scripts: the reference policy and loops, turns, timing and reporting.

Every benchmark measures the same work, CartPole-v1 driven by a 4-64-64-2 Tanh MLP that
samples a categorical action, so figures from different scripts compare directly. The
references (the loop a user writes instead, and the ceiling of independent loop processes)
live in :mod:`acollect.cli._reference_loops`, so ``acollect bench`` measures against the same.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from acollect.cli._reference_loops import (
    ENV_ID,
    CategoricalMLPPolicy,
    CleanRLLoop,
    IndependentLoops,
    make_policy,
    run_independent_loops,
)

__all__ = [
    "ENV_ID",
    "CategoricalMLPPolicy",
    "CleanRLLoop",
    "IndependentLoops",
    "Measurement",
    "Turns",
    "cpu_of",
    "load_average",
    "machine_info",
    "make_policy",
    "median",
    "run_independent_loops",
    "run_interleaved",
    "settle",
    "single_thread_torch",
    "write_json",
]


def single_thread_torch() -> None:
    """Pins torch to one intra-op thread, as the workers of a collector do."""
    torch.set_num_threads(1)


def median(xs: Sequence[float]) -> float:
    """The median, ``nan`` for no value."""
    return statistics.median(xs) if xs else float("nan")


@dataclass
class Turns:
    """Wall and CPU seconds of contenders that take turns batch by batch (or round by round) in one process.

    :meth:`add` (or :meth:`start` then :meth:`stop`) records one turn; :meth:`rates` gives each
    contender's total frames over its total seconds, on both clocks. CPU time is this process's, all threads
    included: the share of the machine that other jobs take does not enter it.
    """

    frames: dict[str, list[int]] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, frames: int, wall_s: float, cpu_s: float) -> None:
        self.frames.setdefault(name, []).append(frames)
        self.wall.setdefault(name, []).append(wall_s)
        self.cpu.setdefault(name, []).append(cpu_s)

    def start(self) -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def stop(self, name: str, frames: int, started: tuple[float, float]) -> None:
        self.add(name, frames, time.perf_counter() - started[0], time.process_time() - started[1])

    def rates(self) -> dict[str, dict[str, float]]:
        """``{name: {"wall": frames/s, "cpu": frames/s}}``."""
        return {
            name: {"wall": sum(frames) / sum(self.wall[name]), "cpu": sum(frames) / sum(self.cpu[name])}
            for name, frames in self.frames.items()
        }

    def turn_rates(self, name: str) -> list[float]:
        """Wall-clock frames/s of each of ``name``'s turns."""
        return [f / s for f, s in zip(self.frames[name], self.wall[name], strict=True)]

    def as_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "wall_s": self.wall, "cpu_s": self.cpu, "frames_per_s": self.rates()}


@dataclass
class Measurement:
    """Frames per second of one contender over several rounds."""

    name: str
    frames_per_s: list[float] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)
    skipped: str | None = None

    @property
    def median(self) -> float:
        """Median frames/s, ``nan`` when it never ran."""
        return median(self.frames_per_s)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, the median included."""
        return {**asdict(self), "median_frames_per_s": None if not self.frames_per_s else self.median}


# A contender runs one round and returns (frames collected in the timed part, seconds, startup seconds).
Contender = Callable[[], tuple[int, float, float]]


def run_interleaved(
    contenders: Sequence[tuple[str, Contender | str]],
    rounds: int,
    *,
    log: Callable[[str], None] = print,
) -> list[Measurement]:
    """Runs the contenders in turns, ``rounds`` times each, so drift in machine load hits all alike.

    Args:
        contenders: ``(name, run)`` pairs; ``run`` may be a string saying why it is skipped.
        rounds: how many times each contender runs.
        log: where one line per finished round goes.

    Returns:
        One :class:`Measurement` per contender, in the order given.
    """
    results = [Measurement(name) for name, _ in contenders]
    for result, (_, run) in zip(results, contenders, strict=True):
        if isinstance(run, str):
            result.skipped = run
    for round_index in range(rounds):
        for result, (name, run) in zip(results, contenders, strict=True):
            if isinstance(run, str):
                continue
            frames, seconds, startup = run()
            result.frames_per_s.append(frames / seconds)
            result.startup_s.append(startup)
            log(f"round {round_index + 1}/{rounds}  {name:<28} {frames / seconds:>10,.0f} frames/s")
    return results


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """What the figures were measured on, the load average at the start included."""
    import gymnasium
    import tensordict

    import acollect

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gymnasium": gymnasium.__version__,
        "tensordict": tensordict.__version__,
        "acollect": acollect.__version__,
        "loadavg_at_start": load_average(),
    }


def write_json(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Writes ``payload`` as indented JSON (the load average at the end added), creating parent folders."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "loadavg_at_end": load_average()}
    target.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"results written to {target}")


def cpu_of(pids: list[int]) -> float:
    """User and system CPU seconds of the processes ``pids`` so far (ended ones count nothing)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def settle(pids: list[int], *, cores: float = 0.15, interval: float = 0.5, limit: float = 30.0) -> float:
    """Waits (untimed) until every contender has finished collecting ahead after its last turn: until this process
    and ``pids`` use less than ``cores`` over ``interval`` seconds (at most ``limit`` seconds). Without it torchrl's
    collectors refill their result queues during the next contender's turn (at 2 x 16 transitions or chunks that
    took most of a core for seconds, in acollect's turns). Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        cpu = time.process_time() + cpu_of(pids)
        await asyncio.sleep(interval)
        if time.process_time() + cpu_of(pids) - cpu < cores * interval:
            break
    return time.perf_counter() - started
