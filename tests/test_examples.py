"""Smoke tests: every example runs on its own, for a short budget, as a user would start it."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Each example with arguments that keep it to a few seconds, and a line its output must contain.
CASES = {
    "async_envs.py": (["--iterations", "2", "--frames-per-batch", "512", "--num-envs", "8"], "done:"),
    "quickstart.py": (["--total-frames", "4096", "--frames-per-batch", "1024", "--num-envs", "4"], "frames/s"),
    "background_buffer.py": (["--train-steps", "100", "--frames-per-batch", "128"], "done:"),
    "central_inference.py": (
        ["--total-frames", "2048", "--frames-per-batch", "512", "--envs-per-worker", "4", "--hidden", "32"],
        "eval return after training",
    ),
    "dqn_cartpole.py": (
        [
            "--total-frames",
            "2048",
            "--learning-starts",
            "512",
            "--frames-per-update",
            "8",
            "--eval-every",
            "100",
            "--eval-episodes",
            "2",
        ],
        "eval return",
    ),
    "ppo_cartpole.py": (["--total-frames", "2048", "--frames-per-batch", "1024", "--epochs", "1"], "done:"),
    "pendulum_sac.py": (
        [
            *("--total-frames", "1536", "--learning-starts", "1024", "--frames-per-update", "8"),
            *("--eval-every", "1024", "--eval-episodes", "1", "--hidden", "32", "--batch-size", "32"),
        ],
        "eval return",
    ),
    "reinforce_episodes.py": (
        ["--total-frames", "2048", "--frames-per-batch", "256", "--trajs-per-batch", "8"],
        "done:",
    ),
    "ray_cluster.py": (["--total-frames", "2048", "--frames-per-batch", "512", "--num-envs", "2"], "done:"),
    "mappo.py": (
        [
            *("--total-frames", "1200", "--frames-per-batch", "600", "--num-envs", "6"),
            *("--epochs", "1", "--hidden", "32"),
        ],
        "done:",
    ),
}

# Examples that need an optional extra: skipped (not failed) where one of its modules is not installed.
REQUIRES = {"ray_cluster.py": ("ray",), "async_envs.py": ("aiohttp",), "mappo.py": ("torchrl", "vmas")}
# Examples that CI runs in the step that installs their extra, which selects its tests by mark (`-m torchrl`).
MARKS = {"mappo.py": [pytest.mark.torchrl]}
# Examples that start third-party daemons (Ray's GCS, raylet, dashboard), which would inherit
# PYTHONWARNINGS and die on their own deprecation warnings: warnings are errors in the example's
# process only (``-W error``).
OWN_PROCESS_WARNINGS = {"ray_cluster.py"}


def examples(slow: tuple[str, ...] = ()) -> list[object]:
    """Every example as a test parameter, with its marks (and ``slow`` for the names given)."""
    return [
        pytest.param(n, marks=[*MARKS.get(n, []), *([pytest.mark.slow] if n in slow else [])]) for n in sorted(CASES)
    ]


def test_every_example_has_a_smoke_test() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts <= set(CASES), f"examples without a smoke test: {sorted(scripts - set(CASES))}"


def test_docs_examples_page_names_every_example() -> None:
    page = (EXAMPLES.parent / "docs" / "examples.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([\w.]+\.py)` \|", page, flags=re.M))
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert rows == scripts, f"missing from the table: {sorted(scripts - rows)}; gone: {sorted(rows - scripts)}"
    for other in sorted(p.name for p in EXAMPLES.iterdir() if p.is_file() and p.suffix != ".py"):
        assert f"`{other}`" in page, f"docs/examples.md does not mention examples/{other}"


def args_fields(path: Path) -> list[tuple[str, object, str]]:
    """(name, default, docstring) of each field of the example's ``Args`` dataclass, read from its source."""
    module = ast.parse(path.read_text(encoding="utf-8"))
    (args,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Args"]
    fields = []
    for node, doc in zip(args.body, args.body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
            assert isinstance(node.target, ast.Name)
            assert node.value is not None
            fields.append((node.target.id, ast.literal_eval(node.value), str(doc.value.value)))
    return fields


@pytest.mark.parametrize("name", examples())
def test_example_help_shows_each_option_with_its_description_and_default(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tyro")
    fields = args_fields(EXAMPLES / name)
    assert fields, f"{name} has no Args fields with docstrings"
    # The example's own `__main__` block, run in this process (a fresh interpreter would spend seconds importing
    # torch for a help text), with a wide terminal, so no description is wrapped across lines.
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), "--help"])
    for module in REQUIRES.get(name, ()):
        pytest.importorskip(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    assert exited.value.code in (0, None), f"{name} --help exited with {exited.value.code}"
    out = capsys.readouterr().out
    shown = " ".join(out.replace("│", " ").split())  # the text without tyro's box or line breaks
    module_doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text(encoding="utf-8")))
    assert module_doc, f"{name} has no docstring"
    summary = " ".join(module_doc.splitlines()[0].split())
    assert summary in shown, f"{name} --help lacks its description {summary!r}:\n{out}"
    for field, default, doc in fields:
        flag = "--" + field.replace("_", "-")
        # The flag (its metavar, or its --no- twin), then the field's docstring and its default.
        option = rf"{re.escape(flag)}(?: [A-Z]+|, --no-{re.escape(flag[2:])})"
        value = "|".join(re.escape(v) for v in {str(default), repr(default)})
        pattern = rf"{option} {re.escape(' '.join(doc.split()))} \(default: (?:{value})\)"
        assert re.search(pattern, shown), f"{name} --help lacks {flag} {doc!r} (default: {default!r}):\n{out}"


# The Ray example starts a Ray cluster of its own (about 12 s), the MAPPO one imports TorchRL and builds VMAS
# (about 10 s): slow, run by CI (tests/conftest.py marks the others).
@pytest.mark.parametrize("name", examples(slow=("ray_cluster.py", "mappo.py")))
def test_example_runs(name: str) -> None:
    for module in REQUIRES.get(name, ()):
        pytest.importorskip(module)
    args, expected = CASES[name]
    if name in OWN_PROCESS_WARNINGS:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
        command = [sys.executable, "-W", "error", str(EXAMPLES / name), *args]
    else:
        env = {**os.environ, "PYTHONWARNINGS": "error"}
        command = [sys.executable, str(EXAMPLES / name), *args]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert expected in proc.stdout
    with open(EXAMPLES / name) as f:
        first = f.readline()
    assert first.startswith('"""'), "an example states what it shows in its first line"
    assert len(first.strip()) > 10, "an example states what it shows in its first line"


def test_pendulum_sac_runs_a_mujoco_env_with_the_mujoco_extra(tmp_path: Path) -> None:
    # The same file on HalfCheetah-v5: float64 observations, 6 continuous actions, 1,000-step episodes.
    pytest.importorskip("mujoco")
    args = ["--env-id", "HalfCheetah-v5", *CASES["pendulum_sac.py"][0]]
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "pendulum_sac.py"), *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,  # MuJoCo 4 writes its deprecation warnings to MUJOCO_LOG.TXT in the working dir
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert proc.returncode == 0, f"HalfCheetah-v5 failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert "eval return" in proc.stdout
    assert "done: 1536 frames" in proc.stdout


@pytest.mark.parametrize("name", examples())
def test_example_defaults_give_no_rounding_warning(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The smoke test above shortens each run; its defaults, what a user runs, must be warning-free too:
    # batches of whole env steps, and a total of whole batches.
    spec = importlib.util.spec_from_file_location(f"example_{name[:-3]}", EXAMPLES / name)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclass looks its annotations up there
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:  # an optional extra (ray) that is not installed
        pytest.skip(str(exc))
    args = module.Args()
    envs = getattr(args, "num_envs", 1) * getattr(args, "num_workers", getattr(args, "num_collectors", 1))
    assert args.frames_per_batch % envs == 0, f"{name}: frames_per_batch is rounded up to a multiple of {envs}"
    total = getattr(args, "total_frames", -1)
    assert total == -1 or total % args.frames_per_batch == 0, f"{name}: total_frames is not whole batches"


def test_quickstart_as_the_readme_runs_it_is_warning_free() -> None:
    # `python examples/quickstart.py`, no arguments: the first command a user runs prints no warning.
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert proc.returncode == 0, f"quickstart failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert "Warning" not in proc.stderr, proc.stderr[-4000:]
    assert "collected 102400 frames" in proc.stdout
