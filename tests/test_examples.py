"""Smoke tests: every example runs on its own, for a short budget, as a user would start it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Each example with arguments that keep it to a few seconds, and a line its output must contain.
CASES = {
    "quickstart.py": (["--total-frames", "4096", "--frames-per-batch", "1024", "--num-envs", "4"], "frames/s"),
    "background_buffer.py": (["--train-steps", "100", "--frames-per-batch", "128"], "done:"),
    "dqn_cartpole.py": (
        ["--total-frames", "2048", "--learning-starts", "512", "--frames-per-update", "8", "--eval-every", "100"]
        + ["--eval-episodes", "2"],
        "eval return",
    ),
    "ppo_cartpole.py": (["--total-frames", "2048", "--frames-per-batch", "1024", "--epochs", "1"], "done:"),
}


def test_every_example_has_a_smoke_test() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts <= set(CASES), f"examples without a smoke test: {sorted(scripts - set(CASES))}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name: str) -> None:
    args, expected = CASES[name]
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
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
    assert first.startswith('"""') and len(first.strip()) > 10, "an example states what it shows in its first line"
