"""Fixtures for the multi-process collector tests: real worker processes, and a check that none leaks.

Tests start workers with the fork server, as the collectors do by default (``ACOLLECT_TEST_START_METHOD``
overrides it): it imports torch once, so the suite does not pay an interpreter start-up per worker. Tests that
are about spawned workers' start-up itself pass ``"spawn"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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
