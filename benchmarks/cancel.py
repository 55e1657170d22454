"""How long a cancelled set-up takes to give control back, for every worker collector, and how late a send's
deadline ends it.

A fresh collector's first ``anext()`` starts its workers; the caller cancels it after a random
moment (``anyio.move_on_after``), while the workers are still booting. What is measured is the time
from the deadline until control is back, then the time ``async_shutdown()`` takes after it: the
promise is a few hundredths of a second at any point of set-up, with nothing left behind (the
test suite checks that part, and that control comes back at all: tests/chaos/test_chaos_cancel.py).

Then the collector's endpoint sending to a worker that reads nothing, its queue full: each ``send(...,
timeout=0.2)`` raises ``TimeoutError``, and what is measured is how long after its 0.2 s it does, under asyncio
and trio (tests/transport/test_endpoint.py checks that it raises, never before its deadline).

Examples::

    python benchmarks/cancel.py
    python benchmarks/cancel.py --rounds 10 --start-method forkserver --json docs/data/cancel.json
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import anyio
from _common import CategoricalMLPPolicy, machine_info, median, write_json

from acollect import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from acollect._runtime.endpoint import Endpoint, WorkerSocket
from acollect.envs import GymEnv

#: The timeout of each send to a full queue (seconds).
SEND_TIMEOUT = 0.2

KINDS = {"MultiSyncCollector": MultiSyncCollector, "MultiAsyncCollector": MultiAsyncCollector,
         "AsyncBatchedCollector": AsyncBatchedCollector}  # fmt: skip


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1", num_envs=2)


async def one_round(cls: Any, deadline: float, start_method: str) -> tuple[float, float]:
    # The central-inference collector needs a policy for its server; the others sample random actions.
    policy = CategoricalMLPPolicy(4, 2) if cls is AsyncBatchedCollector else None
    collector = cls([make_env] * 2, policy, frames_per_batch=64, start_method=start_method)
    with anyio.move_on_after(deadline):
        started = time.monotonic()
        await anext(collector)
    late = time.monotonic() - started - deadline
    closing = time.monotonic()
    await collector.async_shutdown()
    return late, time.monotonic() - closing


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    results: dict[str, Any] = {}
    for name, cls in KINDS.items():
        late, close = [], []
        for _ in range(args.rounds):
            a, b = await one_round(cls, rng.uniform(0.02, args.max_deadline), args.start_method)
            late.append(a)
            close.append(b)
        results[name] = {"late_s": late, "late_median_s": median(late), "late_max_s": max(late),
                         "shutdown_max_s": max(close)}  # fmt: skip
        print(f"{name:22s} control back {median(late) * 1e3:6.1f} ms after the deadline (median), "
              f"{max(late) * 1e3:6.1f} ms at most; shutdown after it {max(close) * 1e3:6.1f} ms at most")  # fmt: skip
    return results


async def send_lateness(rounds: int) -> list[float]:
    """Seconds past ``SEND_TIMEOUT`` at which each of ``rounds`` sends to a worker that reads nothing raised."""
    late: list[float] = []
    async with Endpoint(hwm=1) as endpoint:
        with WorkerSocket(endpoint.address, b"w0", hwm=1) as worker:
            worker.send([b"hello"], timeout=10.0)
            await endpoint.recv(timeout=10.0)
            big = b"x" * 1_000_000  # fills the kernel's buffers too, in a few messages
            while len(late) < rounds:
                started = time.monotonic()
                try:
                    await endpoint.send(b"w0", [big], timeout=SEND_TIMEOUT)
                except TimeoutError:
                    late.append(time.monotonic() - started - SEND_TIMEOUT)
                else:
                    if time.monotonic() - started > 10 * SEND_TIMEOUT:
                        raise RuntimeError("a send waited far past its timeout and went through")
    return late


def sends(rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for backend in ("asyncio", "trio"):
        late = anyio.run(send_lateness, rounds, backend=backend)
        results[backend] = {"late_s": late, "late_median_s": median(late), "late_max_s": max(late)}
        print(f"send to a full queue ({backend:7s}) TimeoutError {median(late) * 1e3:5.1f} ms after its "
              f"{SEND_TIMEOUT} s (median), {max(late) * 1e3:5.1f} ms at most")  # fmt: skip
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="cancelled set-ups per collector (default 5)")
    parser.add_argument("--max-deadline", type=float, default=0.5, help="latest cancellation, s (default 0.5)")
    parser.add_argument("--start-method", default="spawn", choices=["spawn", "forkserver"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--send-rounds", type=int, default=20, help="timed-out sends per event loop (default 20)")
    parser.add_argument("--json", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args()
    results = anyio.run(run, args)
    results["send_to_a_full_queue"] = sends(args.send_rounds)
    if args.json:
        write_json(args.json, {"machine": machine_info(), "args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
