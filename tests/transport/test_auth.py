"""CURVE keys on endpoints: allowed keys get in, every other peer is refused and counted."""

from __future__ import annotations

import doctest
import shutil
import tempfile
from pathlib import Path

import pytest

from acollect import ConfigurationError
from acollect._runtime.endpoint import Endpoint, WorkerSocket
from acollect.testing import wait_until
from acollect.transport import auth  # the public module, whose docstring holds the example
from acollect.transport.auth import ClientKeys, ServerKeys, create_keys, curve_available

pytestmark = [pytest.mark.skipif(not curve_available(), reason="libzmq without CURVE"), pytest.mark.timeout(60)]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    create_keys(tmp_path / "k", workers=["good"])
    create_keys(tmp_path / "other", workers=["stranger"])
    return tmp_path


async def test_allowed_key_gets_in_and_others_are_counted(keys: Path) -> None:
    stranger = ClientKeys.load(keys / "other", "stranger")
    impostor = ClientKeys(stranger.public, stranger.secret, ServerKeys.load(keys / "k").public)  # right collector key
    async with Endpoint("tcp://127.0.0.1:0", keys=ServerKeys.load(keys / "k")) as endpoint:
        assert endpoint.secure
        with WorkerSocket(endpoint.address, b"good", keys=ClientKeys.load(keys / "k", "good")) as good:
            good.send([b"hello"], timeout=5)
            identity, frames = await endpoint.recv(timeout=5)
            assert (identity, bytes(frames[0])) == (b"good", b"hello")
        # An unlisted key, no CURVE at all, and a worker holding another collector's public key.
        with (
            WorkerSocket(endpoint.address, b"bad", keys=impostor) as bad,
            WorkerSocket(endpoint.address, b"plain") as plain,
            WorkerSocket(endpoint.address, b"lost", keys=stranger) as lost,
        ):
            for sock in (bad, plain, lost):
                with pytest.raises(TimeoutError):
                    sock.send([b"let me in"], timeout=0.3)
            await wait_until(lambda: endpoint.rejected_connections >= 3, timeout=10)
        assert endpoint.rejected_keys == {stranger.public.decode(): 1}  # the one that reached the allow-list
        with pytest.raises(TimeoutError):
            await endpoint.recv(timeout=0.2)  # nothing of theirs got through
    assert endpoint.rejected_connections >= 3  # still readable after close


async def test_revoking_a_key_takes_effect_on_the_next_connection(keys: Path) -> None:
    async with Endpoint("tcp://127.0.0.1:0", keys=ServerKeys.load(keys / "k")) as endpoint:
        (keys / "k" / "authorized" / "good.key").unlink()
        with WorkerSocket(endpoint.address, b"good", keys=ClientKeys.load(keys / "k", "good")) as good:
            with pytest.raises(TimeoutError):
                good.send([b"hello"], timeout=0.5)
        await wait_until(lambda: endpoint.rejected_connections >= 1, timeout=10)


def test_key_files_and_errors(keys: Path) -> None:
    assert oct((keys / "k" / "good.key_secret").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(ConfigurationError, match="exists already"):
        create_keys(keys / "k", workers=["good"])
    with pytest.raises(ConfigurationError, match="name"):
        create_keys(keys / "k", workers=["../evil"])
    with pytest.raises(ConfigurationError, match="no secret key file"):
        ClientKeys.load(keys / "k", "nobody")
    shutil.rmtree(keys / "k" / "authorized")
    with pytest.raises(ConfigurationError, match="allow-list"):
        ServerKeys.load(keys / "k")
    with pytest.raises(ConfigurationError, match="keys"):
        Endpoint("tcp://127.0.0.1:0", keys="not keys")  # type: ignore[arg-type]
    assert "secret" not in repr(ClientKeys.load(keys / "k", "good"))


def test_the_modules_example_leaves_no_key_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The example writes secret keys: run where they would stay, and see that nothing does.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = doctest.testmod(auth, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0, result
    assert list(tmp_path.iterdir()) == []
