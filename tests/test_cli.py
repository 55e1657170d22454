"""The ``acollect`` command, run for real in a subprocess as a user types it."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from acollect._batches.shm import shm_available
from acollect.cli._info import collect_info, format_info
from acollect.cli.main import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def acollect(*args: str, timeout: float = 100, **env_vars: str) -> subprocess.CompletedProcess[str]:
    """``python -m acollect ARGS``, from a scratch-free cwd, warnings as errors (and ``env_vars`` set)."""
    env = {**os.environ, "PYTHONWARNINGS": "error", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "acollect", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )


def test_help_loads_no_torch() -> None:
    # `acollect --help` and every `acollect COMMAND --help` answer without torch, whose import takes
    # seconds: each command module imports its heavy dependencies where it runs, and the package lazily.
    code = (
        "import contextlib, io, sys\n"
        "from acollect.cli.main import COMMANDS, build_parser\n"
        "parser = build_parser()\n"
        "names = [m.rsplit('.', 1)[-1].lstrip('_').removesuffix('_cmd') for m in COMMANDS]\n"
        "for argv in [['--help']] + [[name, '--help'] for name in names]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "        parser.parse_args(argv)\n"
        "    assert 'usage: acollect' in out.getvalue(), argv\n"
        "print(len(names), sorted(m for m in ('torch', 'tensordict', 'gymnasium') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(len(COMMANDS)), "[]"]


def test_info_reports_this_machine() -> None:
    proc = acollect("info", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    import torch

    import acollect as pkg

    assert report["versions"]["acollect"] == pkg.__version__
    assert report["versions"]["torch"] == str(torch.__version__)
    assert report["cpu"]["logical"] == os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert report["cpu"]["usable_by_this_process"] == usable
    assert report["cpu"]["default_num_workers"] == max(1, usable - 1)
    assert report["cuda"]["available"] == torch.cuda.is_available()
    assert "spawn" in report["multiprocessing"]["acollect_supports"]
    transports = report["transports"]
    assert transports["ipc"] == zmq.has("ipc")
    assert transports["curve"] == zmq.has("curve")
    assert transports["shm"]["available"] == shm_available()
    assert set(report["extras"]) >= {"progress", "torchrl", "ray", "submitit"}


def test_info_lists_every_extra_of_the_project_with_its_packages() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    # A requirement's distribution name: what precedes its extras, version and markers.
    declared = {name: {re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0] for req in reqs} for name, reqs in extras.items()}
    report = collect_info()
    assert {extra: set(packages) for extra, packages in report["extras"].items()} == declared
    text = format_info(report)
    for extra in declared:
        assert re.search(rf"^extra \[{extra}\] ", text, flags=re.M), text


def test_bench_help_shows_the_default_of_every_number() -> None:
    env = {**os.environ, "COLUMNS": "400"}  # no help text wrapped across lines
    proc = subprocess.run([sys.executable, "-m", "acollect", "bench", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = " ".join(proc.stdout.split())
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    numbers = [a for a in subparsers.choices["bench"]._actions if a.type is int]
    assert len(numbers) >= 8
    for action in numbers:
        flag = action.option_strings[0]
        assert re.search(rf"{flag} {action.dest.upper()} [^()]*\(default: {action.default}\)", shown), (flag, shown)


def test_info_text_has_one_line_per_fact() -> None:
    names = [line.split("  ")[0].strip() for line in format_info(collect_info()).splitlines()]
    facts = ("acollect", "torch", "tensordict", "gymnasium", "pyzmq", "anyio", "cpu cores", "torch threads", "cuda")
    for expected in (*facts, "start methods", "transport ipc", "transport tcp", "shared memory", "CURVE (zmq)"):
        assert expected in names


@pytest.mark.parametrize("threads", [1, 2])
def test_info_says_torch_threads_and_advises_one_beside_a_trainer(threads: int) -> None:
    # torch reads OMP_NUM_THREADS at its start: the count a user's program gets, as `acollect info` sees it.
    proc = acollect("info", "--json", OMP_NUM_THREADS=str(threads))
    assert proc.returncode == 0, proc.stderr
    cpu = json.loads(proc.stdout)["cpu"]
    assert cpu["torch_threads"] == threads
    assert cpu["torch_interop_threads"] >= 1
    text = acollect("info", OMP_NUM_THREADS=str(threads)).stdout
    (line,) = [line for line in text.splitlines() if line.startswith("torch threads")]
    assert f"{threads} intra-op, {cpu['torch_interop_threads']} inter-op" in line
    if threads == 1:
        assert cpu["advice"] is None
        assert "set_num_threads" not in line
    else:
        assert "in-process Collector" in cpu["advice"]
        assert "torch.set_num_threads(1)" in line


def test_info_says_which_start_methods_workers_use() -> None:
    report = collect_info()
    report["multiprocessing"] = {"available": ["fork", "spawn", "forkserver"],
                                 "acollect_supports": ["spawn", "forkserver"],
                                 "acollect_default": "forkserver"}  # fmt: skip
    (line,) = [line for line in format_info(report).splitlines() if line.startswith("start methods")]
    assert line.endswith(
        "fork, spawn, forkserver; acollect workers use forkserver by default, spawn with start_method='spawn'; "
        "never fork"
    )
    report["multiprocessing"] = {"available": ["spawn"], "acollect_supports": ["spawn"], "acollect_default": "spawn"}
    (line,) = [line for line in format_info(report).splitlines() if line.startswith("start methods")]
    assert line.endswith("spawn; acollect workers use spawn by default")


# Four start-ups of worker or loop processes (spawn, each importing torch) make this the slowest test here.
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bench_runs_both_workloads_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = acollect("bench", "--frames", "2048", "--pixel-frames", "512", "--json", str(out), timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for workload in ("cartpole", "pixels"):
        # Each title once in what a terminal shows (stdout and stderr), above its own table.
        assert (proc.stdout + proc.stderr).count(f"{workload}: ") == 1, (proc.stdout, proc.stderr)
        assert re.search(rf"^{workload}: .*\ncontender ", proc.stdout, flags=re.M), proc.stdout
    report = json.loads(out.read_text())
    for workload in ("cartpole", "pixels"):
        rows = {r["name"].split(" (")[0]: r for r in report["workloads"][workload]["results"]}
        for name in ("hand loop, in-process", "acollect Collector", "acollect MultiSyncCollector"):
            assert rows[name]["median"] > 0, rows[name]
            assert f"{rows[name]['median']:,.0f}" in proc.stdout
        assert rows["hand loop, in-process"]["vs_hand_loop"] == 1.0
    # Worker processes are also measured against their ceiling: as many hand loops in independent processes.
    rows = {r["name"].split(" (")[0]: r for r in report["workloads"]["cartpole"]["results"]}
    ceiling = rows["ceiling: 2 independent hand loops"]
    assert ceiling["median"] > 0, ceiling
    assert ceiling["vs_ceiling"] == 1.0, ceiling
    for name in ("acollect MultiSyncCollector", "acollect MultiAsyncCollector"):
        assert rows[name]["vs_ceiling"] == pytest.approx(rows[name]["median"] / ceiling["median"]), rows[name]
        assert re.search(rf"^{name} \(2x16 envs\) .* {rows[name]['vs_ceiling']:.2f}x  \S.*$", proc.stdout, flags=re.M)
        # What bounded each collector, in words in its row (docs/metrics.md; "-" where a round this short measured
        # too little to tell): the references have none.
        named = {"env", "policy", "inference", "trainer", "cpu", "trainer_cpu", None}
        assert rows[name]["bottleneck"] in named, rows[name]
    assert rows["hand loop, in-process"]["bottleneck"] is None
    assert rows["acollect Collector"]["vs_ceiling"] is None
    # A column of the CartPole table only, said under it: what the ceiling is.
    assert len(re.findall(r"^contender .* vs ceiling", proc.stdout, flags=re.M)) == 1, proc.stdout
    note = report["workloads"]["cartpole"]["note"]
    assert note.startswith("vs ceiling: frames/s over the ceiling's, 2 copies of the hand loop (2x16 envs)"), note
    assert "never communicating" in note, note
    assert " ".join(note.split()) in " ".join(proc.stdout.split()), proc.stdout
    assert report["workloads"]["pixels"]["note"] is None
    torchrl_rows = [r for r in report["workloads"]["cartpole"]["results"] if r["name"].startswith("torchrl")]
    assert len(torchrl_rows) == 2
    try:
        import torchrl  # noqa: F401
    except ImportError:
        assert all(r["skipped"].startswith("torchrl not importable") for r in torchrl_rows)


def test_bench_rejects_bad_arguments_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workers", "3"]) == 1
    err = capsys.readouterr().err
    assert "--workers" in err
    assert "a divisor of --num-envs (32)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--frames", "1000"], "--frames=1000 is invalid: expected at least one batch, --frames-per-batch (2048)"),
        (["--only", "cartpole", "--frames", "4095", "--frames-per-batch", "4096"], "--frames-per-batch (4096)"),
        (["--pixel-frames", "100"], "--pixel-frames=100 is invalid: expected at least one batch, --pixel-envs x "
         "--pixel-steps (512)"),
    ],
)  # fmt: skip
def test_bench_refuses_fewer_frames_than_one_batch(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 1  # refused before anything is measured
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err


def test_bench_checks_frames_only_for_the_workloads_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # No CartPole round: its --frames do not matter, and the refusal names the pixels' own (checked after it).
    assert main(["bench", "--only", "pixels", "--frames", "10", "--pixel-frames", "100"]) == 1
    err = capsys.readouterr().err
    assert "--pixel-frames=100 is invalid" in err, err
    assert "--frames=10" not in err, err


def test_no_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "usage: acollect" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out


def test_every_registered_command_has_a_parser_and_a_run() -> None:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subparsers.choices) == len(COMMANDS)
    for name, sub in subparsers.choices.items():
        assert callable(sub.get_default("run")), name


def test_console_script_is_installed() -> None:
    script = shutil.which("acollect", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("acollect is not installed in this environment (pip install -e .)")
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert proc.stdout.startswith("acollect ")


def test_every_command_in_the_cli_page_parses() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    shell = "\n".join(re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S))
    lines = [line.split("#")[0].split() for line in shell.splitlines() if line.startswith("acollect ")]
    parser = build_parser()
    checked = 0
    for words in lines:
        if "--help" in words or "--version" in words:
            continue
        parser.parse_args(words[1:])
        checked += 1
    assert checked >= 5
