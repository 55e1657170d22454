"""The default worker count: workers on this host leave the trainer a core of its own.

A multi-process collector given one env factory and no ``num_workers`` starts one worker per usable core but one (at
least one) where its workers run on this host beside the trainer, and one per usable core where they run elsewhere.
Usable cores are those this process may run on (``taskset``, a container's limit), not the machine's count. Nothing
here starts a worker: the count is settled at construction.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from acollect import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from acollect.collectors._worker_configs import default_num_workers
from acollect.testing import CountingEnv


def _usable() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def _cores(cores: set[int]) -> Iterator[None]:
    """This thread restricted to ``cores`` (as ``taskset`` would restrict the process), then given back its own."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector, AsyncBatchedCollector])
def test_local_workers_leave_the_trainer_a_core(cls: type) -> None:
    collector = cls(CountingEnv, torch.nn.Linear(1, 1), frames_per_batch=8)
    assert collector.num_workers == max(1, _usable() - 1) == default_num_workers()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_the_default_follows_the_usable_cores_and_is_never_zero() -> None:
    usable = sorted(os.sched_getaffinity(0))
    with _cores({usable[0]}):  # one core: the trainer shares it with the one worker there must be
        assert MultiSyncCollector(CountingEnv, frames_per_batch=8).num_workers == 1
    if len(usable) >= 3:
        with _cores(set(usable[:3])):
            assert MultiAsyncCollector(CountingEnv, frames_per_batch=8).num_workers == 2


def test_workers_elsewhere_take_every_core() -> None:
    # Ray actors run wherever the cluster puts them, off the trainer's cores: nothing to leave it.
    collector = MultiAsyncCollector(CountingEnv, frames_per_batch=8, launcher="ray")
    assert collector.num_workers == _usable() == default_num_workers(beside_trainer=False)


def test_an_explicit_count_and_a_list_of_factories_are_kept() -> None:
    assert MultiSyncCollector(CountingEnv, frames_per_batch=8, num_workers=3).num_workers == 3
    assert MultiAsyncCollector([CountingEnv] * 3, frames_per_batch=8).num_workers == 3


def test_the_options_reference_states_the_default() -> None:
    # The declaration's doc is what the options reference (docs/options.md) shows, rendered when the docs build.
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "tools"))
    import options_page

    entry = options_page.render().split("### `num_workers`")[1].split("### ")[0]
    assert "less one, at least 1" in " ".join(entry.split())
    assert "`MultiSyncCollector`" in entry
    assert "`AsyncCollector`" not in entry  # one worker: it takes no num_workers
