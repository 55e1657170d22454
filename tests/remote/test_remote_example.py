"""examples/remote_workers.md runs as written: its trainer, its keys command, two ``acollect worker`` shells."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from acollect.transport.auth import curve_available

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "remote_workers.md"

pytestmark = [pytest.mark.skipif(not curve_available(), reason="libzmq without CURVE"), pytest.mark.timeout(180)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # the example end to end: a trainer and two workers, each a fresh interpreter
def test_remote_workers_example(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    trainer = re.search(r"```python\n(.*?)```", text, re.S)
    assert trainer is not None
    port = _free_port()
    source = trainer.group(1).replace("tcp://0.0.0.0:5555", f"tcp://127.0.0.1:{port}")
    source = source.replace("total_frames=204_800", "total_frames=3072")  # 3 batches: a smoke run
    assert f"127.0.0.1:{port}" in source
    assert "total_frames=3072" in source
    (tmp_path / "trainer.py").write_text(source, encoding="utf-8")

    keys_cmd = re.search(r"```bash\n(acollect keys .*?)\n```", text)
    assert keys_cmd is not None
    args = keys_cmd.group(1).split()[1:]
    subprocess.run([sys.executable, "-m", "acollect", *args], cwd=tmp_path, check=True, capture_output=True)

    worker_cmds = re.findall(r"```bash\n(acollect worker .*?)\n```", text)
    assert len(worker_cmds) == 2
    trainer_proc = subprocess.Popen(
        [sys.executable, "-W", "error", "trainer.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "acollect", *cmd.replace("TRAINER_HOST:5555", f"127.0.0.1:{port}").split()[1:]],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for cmd in worker_cmds
    ]
    try:
        out, err = trainer_proc.communicate(timeout=150)
    finally:
        if trainer_proc.poll() is None:
            trainer_proc.kill()
            trainer_proc.communicate(timeout=5)
        codes = []
        for proc in workers:
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=5)
            codes.append(proc.returncode)
    assert trainer_proc.returncode == 0, err.decode()
    assert out.decode().count("frames/s, refused peers: 0") == 3
    assert codes == [0, 0]
