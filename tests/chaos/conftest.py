"""Fixtures of the chaos suite: real worker processes under faults, and a check that nothing leaks.

After each test: no worker process, shared-memory segment or acollect thread is left (as in
``tests/multi``). Workers start with the fork server by default (``ACOLLECT_TEST_START_METHOD``
overrides it): many restarts and many short-lived collectors stay cheap.

How hard the suite pushes is set by environment variables, so a long run by hand uses the same tests:
``ACOLLECT_CHAOS_KILLS`` (worker kills in one run, default 50), ``ACOLLECT_CHAOS_CANCELS``
(cancellation points, default 40; the issue's figure is 200), ``ACOLLECT_CHAOS_SEED`` (random seed;
default: a fresh one, printed on failure), ``ACOLLECT_CHAOS_EXAMPLES`` (hypothesis examples per
malformed-input test, default 60).
"""

from __future__ import annotations

import os
import random
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from chaos_helpers import Ledger, env_int

from acollect import testing

START_METHOD = os.environ.get("ACOLLECT_TEST_START_METHOD", "forkserver")


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """After each test: no worker process, shared-memory segment or acollect thread is left."""
    with testing.no_leaks():
        yield


@pytest.fixture
def start_method() -> str:
    return START_METHOD


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    path = tmp_path / "ledger"
    path.mkdir()
    return Ledger(path)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> Iterator[random.Random]:
    """A seeded random generator; the seed is reported when the test fails, to replay it."""
    seed = env_int("ACOLLECT_CHAOS_SEED", random.randrange(2**32))
    yield random.Random(seed)
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"\nreplay with ACOLLECT_CHAOS_SEED={seed}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
