"""One central-inference step as a worker sees it: observations out, actions back, with no env in between.

A client (a ``RemotePolicy`` in a thread, as in a worker) asks an ``InferenceServer`` (ipc address, this
process) for the actions of ``--rows`` CartPole observations, ``--steps`` times, through a shared-memory
slot and through encoded messages, the two alternating ``--rounds`` times. The policy is the reference
4-64-64-2 MLP with categorical sampling; the round trip includes its pass. Reported: the client's round trip
(p50, p99) and the server's own figures (arrival to answer, forward pass).

    python benchmarks/central_round_trip.py --json docs/data/central-round-trip.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import anyio
import torch
from _common import CategoricalMLPPolicy, machine_info, single_thread_torch, write_json
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import InferenceServer
from acollect.inference.client import RemotePolicy

WAYS = ("slots", "messages")


def step_input(rows: int) -> TensorDict:
    flags = torch.zeros(rows, 1, dtype=torch.bool)
    return TensorDict(
        {"observation": torch.randn(rows, 4), "done": flags, "terminated": flags, "truncated": flags}, [rows]
    )


def client(server: InferenceServer, slots: bool, rows: int, steps: int) -> list[float]:
    policy = RemotePolicy(server.address or "", b"bench", slots=server.slot_address if slots else None)
    td = step_input(rows)
    try:
        for _ in range(200):  # warm: the first step is a message, the slot is made after it
            policy(td)
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            policy(td)
            times.append(time.perf_counter() - started)
        return times
    finally:
        policy.close()


def quantile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(way: str, rows: int, steps: int) -> dict[str, Any]:
    module = TensorDictModule(CategoricalMLPPolicy(), in_keys=["observation"], out_keys=["action"])
    async with InferenceServer(module, address="ipc", max_wait=0) as server:
        server.expect_sources(1)
        times = await anyio.to_thread.run_sync(client, server, way == "slots", rows, steps)
        stats = server.stats()
    return {
        "round_trip_ms_p50": 1000 * quantile(times, 0.5),
        "round_trip_ms_p99": 1000 * quantile(times, 0.99),
        "server_latency_ms_p50": stats.latency_ms_p50,
        "forward_ms_mean": stats.forward_ms_mean,
        "slot_requests": stats.slot_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8, help="observations per request (a worker's envs)")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each way, alternating")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    single_thread_torch()
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for index in range(args.rounds):
        for way in WAYS[index % 2 :] + WAYS[: index % 2]:
            result = anyio.run(measure, way, args.rows, args.steps)
            runs[way].append(result)
            print(
                f"round {index + 1}/{args.rounds} {way:<9} round trip p50 {result['round_trip_ms_p50']:.3f} ms, "
                f"p99 {result['round_trip_ms_p99']:.3f} ms; server p50 {result['server_latency_ms_p50']:.3f} ms, "
                f"forward {result['forward_ms_mean']:.3f} ms",
                flush=True,
            )
    summary = {
        way: {key: sorted(r[key] for r in results)[len(results) // 2] for key in results[0]}
        for way, results in runs.items()
    }
    for way, figures in summary.items():
        print(f"{way:<9} (median of rounds): round trip p50 {figures['round_trip_ms_p50']:.3f} ms, "
              f"p99 {figures['round_trip_ms_p99']:.3f} ms")  # fmt: skip
    if args.json:
        write_json(args.json, {"benchmark": "central_round_trip", "args": vars(args), "machine": machine_info(),
                               "runs": runs, "summary": summary})  # fmt: skip


if __name__ == "__main__":
    main()
