"""acollect's warnings point at the user's line: from any depth of acollect frames, and from collection threads."""

from __future__ import annotations

import inspect
import threading
import warnings

import anyio
import pytest

from acollect import Collector, MultiAsyncCollector, MultiSyncCollector
from acollect._runtime.threads import run_in_thread
from acollect._warnings import warn
from acollect.testing import CountingEnv


def _warn_in_thread(_stop: threading.Event) -> str:
    warn("from the collection thread")
    return threading.current_thread().name


async def test_a_warning_raised_in_a_collection_thread_points_at_the_awaiting_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        name = await run_in_thread(_warn_in_thread, name="warns")
    assert name.startswith("acollect-")  # it really ran in a thread of its own
    # The awaiting line, not the thread's function (nor acollect/_threads.py).
    assert [(str(w.message), w.filename, w.lineno) for w in caught] == [("from the collection thread", __file__, line)]


async def test_a_thread_warning_under_error_filter_is_raised_where_awaited() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="from the collection thread"):
            await run_in_thread(_warn_in_thread, name="warns")


async def test_a_thread_that_raises_raises_its_error_not_its_warning() -> None:
    def warn_then_fail(_stop: threading.Event) -> None:
        warn("a warning first")
        raise KeyError("the error")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyError, match="the error"):
            await run_in_thread(warn_then_fail, name="fails")


def test_the_other_threads_warnings_are_left_alone() -> None:
    # Kept per thread, never through warnings.catch_warnings (process-wide): a warning of another thread
    # while a collection thread runs is warned there, as usual.
    seen: list[str] = []

    def other() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn("from a plain thread")
        seen.extend(str(w.message) for w in caught)

    async def main() -> None:
        def collect(_stop: threading.Event) -> None:
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()

        await run_in_thread(collect, name="outer")

    anyio.run(main)
    assert seen == ["from a plain thread"]


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector])
def test_construction_warnings_point_at_the_caller(cls: type) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls(CountingEnv, None, frames_per_batch=4, total_frames=10)
    assert [w.filename for w in caught] == [__file__], [str(w.message) for w in caught]


def test_an_unclosed_warning_made_an_error_reaches_pythons_own_hook_whole() -> None:
    # Outside pytest (whose hook takes anything), `python -W error` leaves sys.unraisablehook as Python's own, which
    # refuses any argument but its UnraisableHookArgs: the warning is said as that hook says it, never a TypeError.
    import subprocess
    import sys

    code = (
        "from acollect._warnings import warn_unclosed\n"
        "class Thing: pass\n"
        "warn_unclosed(Thing(), 'Thing was never closed')\n"
        "print('went on')\n"
    )
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "went on"
    assert "Exception ignored in: <__main__.Thing object" in proc.stderr, proc.stderr
    assert "ResourceWarning: Thing was never closed" in proc.stderr, proc.stderr
    assert "UnraisableHookArgs" not in proc.stderr, proc.stderr
