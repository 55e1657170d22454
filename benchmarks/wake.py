"""How long an idle worker takes to answer its collector: a credit's way to the worker and the batch's way back.

``MultiAsyncCollector`` with ``credits=1`` and batches of one step of one ``CountingEnv`` (the step costs next to
nothing): each ``anext()`` after an idle pause hands out the batch collected ahead, which sends the worker its
credit, then waits for the next batch, which the worker collects only once that credit came. The time of that second
``anext()`` is the round trip of a credit to an idle worker and of a batch back, what every batch costs a trainer
that is slower than its workers, and what every turn of ``ceiling.py`` pays at its start::

    python benchmarks/wake.py --rounds 300 --idle-ms 20

``--idle-ms`` is the pause before each round (the worker sleeps on its credit meanwhile); ``--workers`` more
workers, all idle, only one of whose batches is timed at a time (the others' credits come with theirs).

An idle core is not a waiting one: on a virtual machine a halted vCPU takes tens to hundreds of microseconds to run
again, and a round trip pays that for each core it wakes. ``--spinners N`` keeps the cores awake with ``N`` processes
spinning at the lowest priority (``nice 19``: any thread that wakes takes their core at once), to tell the two
apart::

    python benchmarks/wake.py --rounds 300 --idle-ms 2 --spinners 2
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import subprocess
import sys
import time

from acollect import MultiAsyncCollector
from acollect.testing import CountingEnv


async def measure(rounds: int, idle_s: float, workers: int) -> list[float]:
    make = functools.partial(CountingEnv, num_envs=1)
    times: list[float] = []
    async with MultiAsyncCollector([make] * workers, frames_per_batch=1, total_frames=-1, credits=1) as collector:
        for _ in range(20 * workers):  # warm-up: every worker started and sent batches
            await anext(collector)
        for _ in range(rounds):
            await asyncio.sleep(idle_s)  # every worker has collected its batch ahead and waits for a credit
            for _ in range(workers):
                await anext(collector)  # the batches collected ahead: their credits start the workers
            started = time.perf_counter()
            await anext(collector)  # the first batch collected on those credits
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=300, help="timed round trips")
    parser.add_argument("--idle-ms", type=float, default=20.0, help="pause before each round trip")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--spinners", type=int, default=0, help="processes spinning at nice 19 meanwhile")
    args = parser.parse_args()
    spin = "import os; os.nice(19)\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(args.spinners)]
    try:
        times = asyncio.run(measure(args.rounds, args.idle_ms / 1000, args.workers))
    finally:
        for process in spinners:
            process.kill()
            process.wait()
    ms = sorted(t * 1000 for t in times)
    spun = f", {args.spinners} spinner(s) on {os.cpu_count()} cores" if args.spinners else ""
    print(f"credit to an idle worker and its batch back, {args.workers} worker(s){spun}, {args.rounds} rounds after "
          f"{args.idle_ms:g} ms idle: median {statistics.median(ms):.3f} ms, p90 {ms[int(0.9 * len(ms))]:.3f} ms, "
          f"min {ms[0]:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
