"""Shared pieces of the benchmark scripts: the reference policy, timing and reporting.

Every benchmark measures the same work, CartPole-v1 driven by a 4-64-64-2 Tanh MLP that
samples a categorical action, so figures from different scripts compare directly.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "CategoricalMLPPolicy",
    "Measurement",
    "format_table",
    "machine_info",
    "make_mlp",
    "run_interleaved",
    "single_thread_torch",
    "timed",
    "write_json",
]


def make_mlp(obs_dim: int = 4, n_actions: int = 2, hidden: int = 64) -> nn.Sequential:
    """The reference network: ``obs_dim -> hidden -> hidden -> n_actions`` with Tanh, producing logits."""
    return nn.Sequential(
        nn.Linear(obs_dim, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, n_actions),
    )


class CategoricalMLPPolicy(nn.Module):
    """Observation in, sampled action out: the plain-module policy every benchmark uses.

    Sampling is ``torch.multinomial`` on the softmax of the logits: on a small batch it
    costs about half of building a ``torch.distributions.Categorical`` per step, and draws
    from the same distribution.

    Examples:
        >>> policy = CategoricalMLPPolicy()
        >>> policy(torch.zeros(8, 4)).shape
        torch.Size([8])
    """

    def __init__(self, obs_dim: int = 4, n_actions: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.net = make_mlp(obs_dim, n_actions, hidden)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.net(observation), dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)


def single_thread_torch() -> None:
    """Pins torch to one intra-op thread, as the workers of a collector do."""
    torch.set_num_threads(1)


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
        return statistics.median(self.frames_per_s) if self.frames_per_s else float("nan")

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


_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_clock: Callable[[], float] = time.perf_counter


def set_clock(name: str) -> None:
    """Selects what :func:`now` measures: ``"wall"`` time, or ``"cpu"`` time of this process (all threads).

    On a shared, loaded machine CPU time is far steadier than wall time: other processes
    stretch the wall clock, not this process's CPU seconds. Benchmarks whose work runs in
    other processes must use the wall clock.
    """
    global _clock
    _clock = _CLOCKS[name]


def now() -> float:
    """The selected clock (see :func:`set_clock`)."""
    return _clock()


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """Calls ``fn`` (which returns a frame count) and returns ``(frames, seconds)`` on the selected clock."""
    start = now()
    frames = fn()
    return frames, now() - start


def format_table(results: Iterable[Measurement], *, baseline: str | None = None) -> str:
    """A plain-text table of median frames/s, each row's ratio to ``baseline`` and the spread."""
    rows = list(results)
    base = next((r.median for r in rows if r.name == baseline and r.frames_per_s), None)
    lines = [f"{'what':<30} {'frames/s (median)':>18} {'min-max':>21} {'vs ' + (baseline or '-'):>16}"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        if not r.frames_per_s:
            lines.append(f"{r.name:<30} {'skipped: ' + (r.skipped or 'not run')}")
            continue
        spread = f"{min(r.frames_per_s):,.0f}-{max(r.frames_per_s):,.0f}"
        ratio = f"{r.median / base:.2f}x" if base else "-"
        lines.append(f"{r.name:<30} {r.median:>18,.0f} {spread:>21} {ratio:>16}")
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    import gymnasium

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gymnasium": gymnasium.__version__,
    }


def write_json(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Writes ``payload`` as indented JSON, creating parent folders."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=2, default=str) + "\n")
