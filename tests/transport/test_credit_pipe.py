"""The pipe: a worker's FIFO its collector writes credits to, one fixed-size record a word, never waiting."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from acollect._batches.slot_ring import (
    CREDIT,
    FREE,
    WAKE,
    CreditPipe,
    CreditPipeWriter,
    credit_pipe_path,
    remove_credit_pipe,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and poll() on pipes are POSIX")


@pytest.fixture
def pipe():
    made = CreditPipe.create(credit_pipe_path())
    yield made
    made.close()


def test_the_worker_reads_every_word_in_order_and_its_own_wakes(pipe: CreditPipe) -> None:
    assert pipe.path is not None
    assert stat.S_ISFIFO(os.stat(pipe.path).st_mode)
    writer = CreditPipeWriter.open(pipe.path)
    try:
        assert not os.path.exists(pipe.path), "opened: its name is removed, nothing else needs it"
        assert pipe.read() == []
        assert writer.credit()
        assert writer.credit(7)
        assert writer.free(2)
        pipe.wake()
        assert pipe.read() == [(CREDIT, -1), (CREDIT, 7), (FREE, 2), (WAKE, -1)]
        assert pipe.read() == []
        many = 1000  # more than one read's worth: read() goes on until the pipe is empty
        for slot in range(many):
            assert writer.free(slot)
        assert pipe.read() == [(FREE, slot) for slot in range(many)]
    finally:
        writer.close()


def test_wait_ends_at_the_first_word_or_at_its_deadline(pipe: CreditPipe) -> None:
    assert pipe.path is not None
    writer = CreditPipeWriter.open(pipe.path)
    try:
        started = time.monotonic()
        assert pipe.wait(0.05) is False
        assert time.monotonic() - started >= 0.04
        timer = threading.Timer(0.1, writer.credit)
        timer.start()
        assert pipe.wait(3600.0) is True  # ended by the word, an hour before its deadline
        timer.join()
        assert pipe.read() == [(CREDIT, -1)]
    finally:
        writer.close()


def test_a_writer_says_when_its_word_cannot_go_and_never_waits(pipe: CreditPipe) -> None:
    assert pipe.path is not None
    writer = CreditPipeWriter.open(pipe.path)
    # Full (nobody read 8,192 records): False at once, and the caller sends the word as a message.
    written = 0
    while writer.credit():
        written += 1
        assert written <= 1 << 20, "a pipe without end"
    assert written >= 512
    assert len(pipe.read()) == written
    assert writer.credit()
    pipe.close()  # the worker is gone: its words are lost with it, and nothing is raised
    assert writer.credit()
    assert writer.free(0)
    writer.close()
    assert writer.closed
    assert writer.credit() is False
    writer.close()  # idempotent


def test_opening_refuses_what_is_not_a_live_workers_fifo(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        CreditPipeWriter.open(str(tmp_path / "nothing"))
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    with pytest.raises(OSError, match="no FIFO"):
        CreditPipeWriter.open(str(plain))
    assert plain.exists(), "a file that is no pipe is never removed"
    link = tmp_path / "link"
    link.symlink_to(plain)
    with pytest.raises(OSError, match=r"symbolic links|Too many levels"):  # ELOOP: no link followed
        CreditPipeWriter.open(str(link))
    orphan = str(tmp_path / "orphan")
    os.mkfifo(orphan)  # made by a worker that died before its hello: nobody reads it
    CreditPipeWriter.open(orphan).close()  # opened all the same (it reads too), and its name removed
    assert not os.path.exists(orphan)
    os.mkfifo(orphan)
    remove_credit_pipe(orphan)
    remove_credit_pipe(str(plain))
    remove_credit_pipe(str(link))
    assert not os.path.exists(orphan)
    assert plain.exists()
    assert link.exists()


def test_a_trainer_that_dies_of_sigpipe_survives_its_workers_death(tmp_path) -> None:
    # Command-line programs often restore SIGPIPE's default action, which kills a process writing to a pipe with no
    # reader; the collector's end reads too, so its pipe writes never raise it.
    script = f"""
import os, signal
from acollect._batches.slot_ring import CreditPipe, CreditPipeWriter
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
pipe = CreditPipe.create({str(tmp_path / "pipe")!r})
writer = CreditPipeWriter.open(pipe.path)
pipe.close()
print(writer.credit(), writer.free(1))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_without_a_fifo_the_worker_waits_on_a_pipe_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    unnamed = CreditPipe.create(None)
    try:
        assert unnamed.path is None
        unnamed.wake()
        assert unnamed.wait(5.0)
        assert unnamed.read() == [(WAKE, -1)]
    finally:
        unnamed.close()

    def no_fifos(path: str, mode: int = 0o666) -> None:  # a filesystem without FIFOs
        raise OSError(95, "Operation not supported", path)

    monkeypatch.setattr(os, "mkfifo", no_fifos)
    path = credit_pipe_path()
    fallback = CreditPipe.create(path)
    try:
        assert fallback.path is None
        assert not os.path.exists(path)
        fallback.wake()
        assert fallback.read() == [(WAKE, -1)]
    finally:
        fallback.close()
        fallback.close()  # idempotent
