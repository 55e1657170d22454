"""Fixtures for the multi-process collector tests: real worker processes, and a check that none leaks.

Tests start workers with the fork server by default (``ACOLLECT_TEST_START_METHOD`` overrides it): it
imports torch once, so the suite does not pay an interpreter start-up per worker. Tests that are about
process start-up itself use ``"spawn"``, the collectors' default.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from acollect._threads import THREAD_NAME_PREFIX

START_METHOD = os.environ.get("ACOLLECT_TEST_START_METHOD", "forkserver")


def _multiprocessing_helpers() -> set[int]:
    """Pids of multiprocessing's own long-lived helpers (fork server, resource tracker): not ours to stop."""
    pids = set()
    try:
        from multiprocessing import forkserver, resource_tracker

        for pid in (getattr(forkserver._forkserver, "_forkserver_pid", None),
                    getattr(resource_tracker._resource_tracker, "_pid", None)):  # fmt: skip
            if pid:
                pids.add(pid)
    except ImportError:  # pragma: no cover
        pass
    return pids


def our_children() -> set[int]:
    """Live descendants of this process, multiprocessing's helpers excepted (their forks are counted)."""
    helpers = _multiprocessing_helpers()
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in helpers or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        found.add(proc.pid)
    return found


def our_segments() -> set[str]:
    """Shared-memory segments this process created."""
    prefix = f"acollect-{os.getpid()}-"
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm here
        return set()


def our_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """After each test: no worker process, shared-memory segment or acollect thread is left."""
    children, segments, threads = our_children(), our_segments(), our_threads()
    yield
    deadline = time.monotonic() + 5.0  # a killed process may take a moment to be reaped
    while True:
        left = (our_children() - children, our_segments() - segments, our_threads() - threads)
        if not any(left) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left[0], f"worker processes left running: {left[0]}"
    assert not left[1], f"shared-memory segments left: {left[1]}"
    assert not left[2], f"threads left running: {left[2]}"


@pytest.fixture
def start_method() -> str:
    return START_METHOD
