"""Fixtures for the central-inference tests: nothing may be left behind (processes, segments, threads)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from acollect import testing

START_METHOD = os.environ.get("ACOLLECT_TEST_START_METHOD", "forkserver")


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    with testing.no_leaks():
        yield


@pytest.fixture
def start_method() -> str:
    return START_METHOD
