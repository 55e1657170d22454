"""worker_affinity: each worker process on its cores (read from outside, by pid), the trainer's given back.

Real worker processes; the cores each one may use are read with ``os.sched_getaffinity(pid)`` through the
collector's public ``worker_pids``, and from inside by the policy (the worker's runner thread, started after the
pinning: what the env's threads see too). The tests that pin need two cores this process may use.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest
from multi_helpers import report_cores
from tensordict.nn import TensorDictModule

from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    ConfigurationError,
    DistributedCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    RayCollector,
)
from acollect.testing import CountingEnv
from acollect.transport.auth import create_keys

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs os.sched_setaffinity")

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores this process may use")


def _mask(cores: set[int]) -> int:
    return sum(1 << core for core in cores)


def _threads_cores() -> list[set[int]]:
    """The cores of every thread of this process (Linux keeps one mask per thread)."""
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")]


@two_cores
async def test_hand_placement_pins_each_worker_to_its_cores(start_method: str) -> None:
    first, second = CORES[0], CORES[1]
    before = os.sched_getaffinity(0)
    async with MultiSyncCollector(
        [CountingEnv] * 2, report_cores, frames_per_batch=8, total_frames=16, start_method=start_method,
        worker_affinity=[{first}, [second]],
    ) as collector:  # fmt: skip
        assert collector.trainer_cores is None  # a list places the workers only
        with anyio.fail_after(60):
            batch = await anext(collector)
        pids = collector.worker_pids
        assert None not in pids
        assert [os.sched_getaffinity(pid) for pid in pids if pid is not None] == [{first}, {second}]
        assert os.sched_getaffinity(0) == before
    # Inside each worker, the thread stepping its env runs where the worker was pinned, with one torch thread.
    assert batch["cores"][0].eq(_mask({first})).all()
    assert batch["cores"][1].eq(_mask({second})).all()
    assert batch["threads"].eq(1).all()
    assert [c.affinity for c in collector.worker_configs] == [[first], [second]]


@two_cores
async def test_a_worker_on_two_cores_runs_two_torch_threads(start_method: str) -> None:
    cores = set(CORES[:2])
    async with AsyncCollector(
        CountingEnv, report_cores, frames_per_batch=4, start_method=start_method, worker_affinity=[cores], num_threads=1
    ) as collector:  # fmt: skip
        with anyio.fail_after(60):
            batch = await anext(collector)
        (pid,) = collector.worker_pids
        assert pid is not None
        assert os.sched_getaffinity(pid) == cores
    assert batch["cores"].eq(_mask(cores)).all()
    assert batch["threads"].eq(2).all()  # one per core: the size of its set, in place of num_threads


@two_cores
async def test_auto_puts_one_worker_on_a_core_and_the_trainer_on_the_rest_then_restores_it(
    start_method: str,
) -> None:
    before = os.sched_getaffinity(0)
    threads_before = _threads_cores()
    collector = AsyncCollector(
        CountingEnv, report_cores, frames_per_batch=4, total_frames=8, start_method=start_method,
        worker_affinity="auto",
    )  # fmt: skip
    assert collector.trainer_cores == tuple(CORES[1:])
    assert collector.worker_configs[0].affinity == [CORES[0]]
    async with collector:
        with anyio.fail_after(60):
            batch = await anext(collector)
        (pid,) = collector.worker_pids
        assert pid is not None
        assert os.sched_getaffinity(pid) == {CORES[0]}
        # Every thread of the trainer, not only the one that pinned it, is off the worker's core.
        assert all(cores == set(CORES[1:]) for cores in _threads_cores())
    assert batch["cores"].eq(_mask({CORES[0]})).all()
    assert os.sched_getaffinity(0) == before
    assert set(map(frozenset, _threads_cores())) <= set(map(frozenset, threads_before)) | {frozenset(before)}


@two_cores
async def test_auto_with_a_worker_per_core_leaves_the_trainer_unpinned(start_method: str) -> None:
    before = os.sched_getaffinity(0)
    n = len(CORES)
    async with MultiAsyncCollector(
        [CountingEnv] * n, frames_per_batch=4, start_method=start_method, worker_affinity="auto"
    ) as collector:
        assert collector.trainer_cores is None
        with anyio.fail_after(60):
            await anext(collector)
        assert [os.sched_getaffinity(pid) for pid in collector.worker_pids if pid is not None] == [{c} for c in CORES]
        assert os.sched_getaffinity(0) == before


@two_cores
async def test_auto_puts_the_inference_server_on_the_trainers_cores(start_method: str) -> None:
    before = os.sched_getaffinity(0)
    policy = TensorDictModule(lambda obs: (obs[..., 0] > 2).long(), in_keys=["observation"], out_keys=["action"])
    async with AsyncBatchedCollector(
        CountingEnv, policy, num_workers=1, frames_per_batch=4, start_method=start_method, worker_affinity="auto"
    ) as collector:
        with anyio.fail_after(60):
            await anext(collector)
        (pid,) = collector.worker_pids
        server = collector.server.pid
        assert pid is not None
        assert server is not None
        assert os.sched_getaffinity(pid) == {CORES[0]}
        assert os.sched_getaffinity(server) == set(CORES[1:]) == os.sched_getaffinity(0)
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize(
    "value",
    [
        [{0}],  # one set for two workers
        [{0}, {0}, {0}],
        [{0}, set()],  # an empty set
        [{0}, {10**6}],  # a core this process may not use
        [{0}, {True}],  # not an int
        [{0}, 1],  # not a set
        "all",
        {0, 1},  # one set, not a list of them
        [],
    ],
    ids=repr,
)
def test_bad_values_are_refused_at_construction_naming_what_is_accepted(value: object) -> None:
    with pytest.raises(ConfigurationError) as caught:
        MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, worker_affinity=value)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(f"worker_affinity={value!r} is invalid: expected ")
    assert "core sets (one per worker)" in message or "one non-empty set of core ids per worker" in message


def test_workers_elsewhere_are_refused(tmp_path: Path) -> None:
    create_keys(tmp_path / "keys")
    ray = r"worker_affinity='auto' is invalid: expected None with the ray launcher"
    with pytest.raises(ConfigurationError, match=ray):
        MultiAsyncCollector([CountingEnv] * 2, frames_per_batch=8, launcher="ray", worker_affinity="auto")
    with pytest.raises(ConfigurationError, match=r"expected None with remote_workers=1"):
        MultiAsyncCollector(
            [CountingEnv] * 2, frames_per_batch=8, worker_affinity="auto", remote_workers=1,
            address="tcp://127.0.0.1:0", keys=tmp_path / "keys",
        )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"torch\.distributed ranks"):
        DistributedCollector([CountingEnv] * 2, frames_per_batch=8, worker_affinity="auto")  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="Ray actors"):
        RayCollector(CountingEnv, frames_per_batch=8, worker_affinity="auto")  # type: ignore[call-arg]


def test_a_platform_that_cannot_pin_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # What macOS has: no os.sched_setaffinity. None is still accepted there.
    monkeypatch.delattr(os, "sched_setaffinity")
    with pytest.raises(ConfigurationError, match=rf"expected None: this platform \({sys.platform}\) cannot pin"):
        MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, worker_affinity="auto")
    assert MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, worker_affinity=None).trainer_cores is None
