"""The default start method: workers forked from a fork server, from any kind of program, with CUDA untouched.

Each program runs in a fresh interpreter in a process group of its own, under a deadline (a hang fails the test,
never the suite), and leaves no process of its group behind: its workers, the fork server and multiprocessing's
resource tracker all end with it. The programs take no ``start_method``: what a new user writes.

* A script without an ``if __name__ == "__main__":`` guard, ``python -c``, and a notebook-like cell (code run by
  ``exec`` in the ``__main__`` of a module started with ``python -m``, as ipykernel is) all collect: multiprocessing
  would have had each worker run the program's main module again, starting a collector inside each worker.
* The workers are forks of the fork server, which never initialised CUDA: importing what it preloads calls nothing
  in ``torch.cuda`` (checked on torch's CUDA entry points themselves, so that it means something on a machine
  without a GPU too), and what a worker inherits from it says CUDA was never initialised there.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The helpers of the Ctrl-C tests, which run their programs in a process group of their own too.
from test_ctrl_c import group_left

from acollect import ConfigurationError, MultiSyncCollector
from acollect._workers import forkserver
from acollect._workers.process import DEFAULT_START_METHOD
from acollect.launchers import LocalLauncher
from acollect.testing import CountingEnv

#: Deadlines that bound a hang; they do not measure speed (a program here takes a few seconds).
RUN = 90.0
GONE = 10.0

#: A program as a new user writes it: no start method, no ``__main__`` guard. Its env factory, defined in
#: ``__main__``, reports from inside each worker what the worker is a fork of and what it inherited.
PROGRAM = """
import asyncio, json, os, sys
import psutil, torch
from acollect import MultiSyncCollector
from acollect.testing import CountingEnv

print("top level", flush=True)  # once: a worker never runs this program again
REPORT = sys.argv[1]

def make_env():
    facts = {
        "pid": os.getpid(),
        "parent": " ".join(psutil.Process(os.getppid()).cmdline()),
        "main_ran": hasattr(sys.modules["__main__"], "make_env"),  # this program, run again as the worker's main
        "cuda_initialized": torch.cuda._initialized,  # as the fork server left it: the raw flag, fork or not
    }
    with open(REPORT, "a") as report:
        report.write(json.dumps(facts) + "\\n")
    return CountingEnv(num_envs=2)

async def main():
    collector = MultiSyncCollector([make_env] * 2, frames_per_batch=16, total_frames=64)
    print("start method", collector.settings.start_method, flush=True)
    async for batch in collector:  # total_frames reached: it shuts itself down
        print("batch", *batch.shape, flush=True)

asyncio.run(main())
"""

#: A notebook-like cell: code run by ``exec`` in ``__main__``, with no file, in a program started with
#: ``python -m`` (so that multiprocessing would have each worker run that module again, as it would ipykernel's).
NOTEBOOK = """
import __main__, sys
exec(compile(open(sys.argv[2]).read(), "<cell>", "exec"), __main__.__dict__)
"""


def run_program(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``python *args`` in a process group of its own, under :data:`RUN`; then waits (under :data:`GONE`)
    until no process of its group is left, and fails if one is."""
    program = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = program.communicate(timeout=RUN)
    except subprocess.TimeoutExpired:
        os.killpg(program.pid, signal.SIGKILL)
        stdout, stderr = program.communicate()
        pytest.fail(f"{args[0]} ... did not end within {RUN:g} s; stdout: {stdout[-2000:]}; stderr: {stderr[-3000:]}")
    try:
        deadline = time.monotonic() + GONE
        while (left := group_left(program.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"left running after the program ended: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(program.pid, signal.SIGKILL)  # what a failed check left
    return subprocess.CompletedProcess(program.args, program.returncode, stdout, stderr)


# `python -c` never ran its code again in a worker (it has no main module to run): slow, a guard against a regression.
@pytest.mark.parametrize("how", ["script", pytest.param("python -c", marks=pytest.mark.slow), "notebook cell"])
def test_a_program_without_a_main_guard_collects_with_the_default_start_method(how: str, tmp_path: Path) -> None:
    report = tmp_path / "workers.jsonl"
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "kernel.py").write_text(NOTEBOOK)
    args = {
        "script": ["program.py", str(report)],
        "python -c": ["-c", PROGRAM, str(report)],
        "notebook cell": ["-m", "kernel", str(report), str(tmp_path / "program.py")],
    }[how]
    done = run_program(args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.splitlines() == ["top level", "start method forkserver", *["batch 2 2 4"] * 4], done.stdout
    workers = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(workers) == 2
    for worker in workers:
        assert "from multiprocessing.forkserver import main" in worker["parent"], worker  # a fork of the server
        assert not worker["main_ran"], worker  # the program never ran in the worker
        assert worker["cuda_initialized"] is False, worker  # nor did the server initialise CUDA before the fork


#: Imports what the fork server preloads, as the server does, with torch's CUDA entry points recording each call:
#: one would initialise CUDA (``torch.cuda.is_available()`` included: it initialises the driver), which no process
#: forked after it could use.
CUDA_PROBE = """
import importlib, json, torch
calls = []
def recording(name, function):
    def wrapper(*args, **kwargs):
        calls.append(name)
        return function(*args, **kwargs)
    return wrapper
for name in ("_lazy_init", "init", "is_available", "device_count", "current_device", "set_device", "synchronize"):
    setattr(torch.cuda, name, recording(f"torch.cuda.{name}", getattr(torch.cuda, name)))
for name in ("_cuda_init", "_cuda_getDeviceCount"):  # what those call, in a torch built with CUDA
    if hasattr(torch._C, name):
        setattr(torch._C, name, recording(f"torch._C.{name}", getattr(torch._C, name)))
from acollect._workers import forkserver  # what multiprocessing is told to preload: it imports the rest
for module in forkserver.PRELOADED_MODULES:
    importlib.import_module(module)
print(json.dumps({"calls": calls, "initialized": torch.cuda.is_initialized()}))
"""


def test_what_the_fork_server_preloads_never_touches_cuda() -> None:
    assert forkserver.PRELOAD == ["acollect._workers.forkserver"]
    assert forkserver.PRELOADED_MODULES == ("torch", "tensordict", "gymnasium", "acollect._workers.main")
    done = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=RUN, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"calls": [], "initialized": False}


def test_the_default_is_the_fork_server_and_spawn_stays_an_option() -> None:
    assert DEFAULT_START_METHOD == "forkserver"
    assert MultiSyncCollector([CountingEnv], frames_per_batch=4).settings.start_method == "forkserver"
    assert LocalLauncher().start_method == "forkserver"
    assert LocalLauncher("spawn").start_method == "spawn"


def test_forkserver_in_a_daemonic_process_is_refused_before_any_worker_starts_naming_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A multiprocessing.Pool worker is daemonic, and multiprocessing forbids a daemonic process children.
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)
    with pytest.raises(ConfigurationError, match=r"start_method='forkserver' is invalid: expected 'spawn'.*daemonic"):
        MultiSyncCollector([CountingEnv], frames_per_batch=4)
    assert MultiSyncCollector([CountingEnv], frames_per_batch=4, start_method="spawn").settings.start_method == "spawn"
