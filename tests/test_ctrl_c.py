"""Ctrl-C in a terminal: SIGINT to the whole process group, the trainer's worker and server processes included.

The trainer decides what a Ctrl-C does (its ``KeyboardInterrupt``); the processes acollect started stay quiet and
end when the trainer stops them, or when it is gone. Each test runs a program in a fresh interpreter in a process
group of its own (as a shell runs a command), sends SIGINT to the whole group, as the terminal does, and asserts,
under deadlines: the program exits, its stderr holds one traceback (the trainer's own, which the program prints
once), and no process of the group is left. Ctrl-C lands while the program collects, and during start-up (workers
starting their interpreters and importing torch, or the fork server importing the worker's code).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

#: Deadlines that bound a hang; they do not measure speed (the program exits within a second or two here).
START = 60.0
EXIT = 15.0
GONE = 10.0

PROGRAM = """
import asyncio, functools, sys, traceback
from acollect import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from acollect.testing import CountingEnv, WeightProbe

kind, start_method = sys.argv[1], sys.argv[2]
envs = [functools.partial(CountingEnv, num_envs=4)] * 2

def collector():
    if kind == "Batched":  # two env workers and the inference server's process
        return AsyncBatchedCollector(envs, WeightProbe(0.0), frames_per_batch=64, start_method=start_method)
    cls = {"MultiSync": MultiSyncCollector, "MultiAsync": MultiAsyncCollector}[kind]
    return cls(envs, frames_per_batch=64, start_method=start_method)

async def main():
    print("starting", flush=True)
    async with collector() as c:
        async for _ in c:
            print("collecting", flush=True)
            await asyncio.sleep(0.01)

try:
    asyncio.run(main())
except KeyboardInterrupt:
    # The trainer's decision, said once: asyncio.run chains the KeyboardInterrupt onto its task's
    # CancelledError, which would print two "Traceback" headers for this one exception.
    traceback.print_exc(chain=False)
    sys.exit(130)
"""


def running_in_group(proc: psutil.Process, pgid: int) -> bool:
    """Whether ``proc`` runs in group ``pgid`` (a zombie has exited: it does not count)."""
    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.Error):
        return False  # gone meanwhile


def group_left(pgid: int) -> list[str]:
    """The processes of group ``pgid`` still running, described."""
    return [f"pid {proc.pid}: {' '.join(proc.info['cmdline'] or [])[:100]}"
            for proc in psutil.process_iter(["cmdline"]) if running_in_group(proc, pgid)]  # fmt: skip


def assert_a_quiet_ctrl_c(kind: str, start_method: str, *, when: str, delay: float) -> None:
    """Runs the program, sends SIGINT to its whole group ``delay`` s after it printed ``when``, and asserts (under
    deadlines) that it exits, with the trainer's traceback only, and leaves no process of its group running."""
    program = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, kind, start_method],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    pgid = program.pid
    assert program.stdout is not None
    assert program.stderr is not None
    stdout, stderr = program.stdout, program.stderr
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def read_lines() -> None:
        for line in stdout:
            lines.put(line.strip())
        lines.put(None)  # the program's end

    # Both pipes read in threads: a deadline on each line, and a full stderr pipe never stalls the program. Each
    # reader ends at EOF: once every process of the group that holds the pipe is gone.
    readers = [threading.Thread(target=read_lines), threading.Thread(target=lambda: errors.append(stderr.read()))]
    for reader in readers:
        reader.start()
    try:
        try:
            deadline = time.monotonic() + START
            while (line := lines.get(timeout=max(0.0, deadline - time.monotonic()))) != when:
                if line is None:
                    raise subprocess.TimeoutExpired(program.args, 0, f"it ended before it printed {when!r}")
            time.sleep(delay)
            os.killpg(pgid, signal.SIGINT)
            program.wait(timeout=EXIT)
        except (queue.Empty, subprocess.TimeoutExpired) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            readers[1].join(timeout=EXIT)
            pytest.fail(f"no {when!r} within {START:g} s, or no exit within {EXIT:g} s of the SIGINT ({exc!r}); "
                        f"stderr: {''.join(errors)[-3000:]}")  # fmt: skip
        readers[1].join(timeout=EXIT)
        text = "".join(errors)
        assert program.returncode == 130, f"the trainer did not end by its KeyboardInterrupt: {text[-3000:]}"
        assert text.count("Traceback") <= 1, f"more than the trainer's own traceback:\n{text[-6000:]}"
        assert "KeyboardInterrupt" in text  # the trainer's, printed by the program
        deadline = time.monotonic() + GONE
        while (left := group_left(pgid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"left running after the trainer exited: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # what a failed check left
        program.wait()
        for reader in readers:
            reader.join(timeout=EXIT)
        stdout.close()
        stderr.close()


@pytest.mark.parametrize(
    ("kind", "start_method"), [("MultiSync", "spawn"), ("MultiAsync", "forkserver"), ("Batched", "spawn")]
)
def test_ctrl_c_while_collecting_ends_the_program_with_the_trainers_traceback_only(
    kind: str, start_method: str
) -> None:
    assert_a_quiet_ctrl_c(kind, start_method, when="collecting", delay=0.3)


@pytest.mark.parametrize(
    ("start_method", "delay"),
    [
        # The workers' interpreters starting. (Before they ignored SIGINT, this failed about every other run: the
        # trainer kills workers that did not say hello yet, sometimes before their traceback is out.)
        ("spawn", 0.05),
        ("forkserver", 0.1),  # the fork server importing the worker's code: it ends, silently
    ],
)
def test_ctrl_c_during_start_up_is_quiet_too(start_method: str, delay: float) -> None:
    assert_a_quiet_ctrl_c("MultiSync", start_method, when="starting", delay=delay)
