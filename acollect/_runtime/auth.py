"""ZeroMQ CURVE keys and the allow-list that decides which workers may connect.

Public as :mod:`acollect.transport.auth`, whose docstring describes it for users.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from acollect.errors import ConfigurationError

__all__ = [
    "COLLECTOR_KEY_NAME",
    "AllowList",
    "ClientKeys",
    "ServerKeys",
    "as_server_keys",
    "create_keys",
    "curve_available",
]

#: The base name of the collector's key files in a key directory.
COLLECTOR_KEY_NAME = "collector"
_AUTHORIZED = "authorized"


def curve_available() -> bool:
    """Whether this libzmq was built with CURVE (libsodium or its tweetnacl copy)."""
    return bool(zmq.has("curve"))


def _require_curve() -> None:
    if not curve_available():
        raise ConfigurationError(
            f"this libzmq ({zmq.zmq_version()}) was built without CURVE encryption: "
            "install a pyzmq wheel (they bundle it) to use keys"
        )


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_." for c in name) or name[0] == ".":
        raise ConfigurationError.bad_value("name", name, "a key name of letters, digits, '-', '_' or '.'")
    if name == COLLECTOR_KEY_NAME:
        raise ConfigurationError.bad_value("name", name, f"a worker key name other than {COLLECTOR_KEY_NAME!r}")
    return name


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        what = "secret key" if secret else "public key"
        raise ConfigurationError(f"no {what} file at {path} (create one with `acollect keys {path.parent}`)")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise ConfigurationError(f"cannot read the key file {path}: {exc}") from exc
    if secret and secret_key is None:
        raise ConfigurationError(f"{path} holds no secret key")
    return public, secret_key


def create_keys(directory: str | os.PathLike[str], *, workers: list[str] | tuple[str, ...] = ("worker",)) -> list[Path]:
    """Writes a collector key pair (unless one exists) and one key pair per worker name, and allows them.

    Args:
        directory: where to write (created if missing).
        workers: worker key names; each public key is also copied into ``authorized/``.

    Returns:
        The key files written (public and secret, collector first).

    Raises:
        ConfigurationError: a bad name, a key that exists already, or no CURVE support.
    """
    _require_curve()
    names = [_check_name(n) for n in workers]
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    (root / _AUTHORIZED).mkdir(exist_ok=True)
    written: list[Path] = []
    if not (root / f"{COLLECTOR_KEY_NAME}.key_secret").exists():
        written += [Path(p) for p in zmq.auth.create_certificates(root, COLLECTOR_KEY_NAME)]
    for name in names:
        if (root / f"{name}.key").exists():
            raise ConfigurationError(f"a key named {name!r} exists already in {root}: pick another name")
        public, secret = (Path(p) for p in zmq.auth.create_certificates(root, name))
        shutil.copyfile(public, root / _AUTHORIZED / public.name)
        written += [public, secret]
    for path in written:
        if path.suffix == ".key_secret":
            path.chmod(0o600)
    return written


@dataclass(frozen=True)
class ServerKeys:
    """The collector's key pair and its allow-list directory."""

    public: bytes
    secret: bytes
    authorized_dir: Path

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ServerKeys:
        """Reads ``collector.key_secret`` and uses ``authorized/`` from a key directory.

        Raises:
            ConfigurationError: a file is missing or unreadable, or no CURVE support.
        """
        _require_curve()
        root = Path(directory)
        public, secret = _load(root / f"{COLLECTOR_KEY_NAME}.key_secret", secret=True)
        authorized = root / _AUTHORIZED
        if not authorized.is_dir():
            raise ConfigurationError(f"no allow-list directory at {authorized} (create keys with `acollect keys`)")
        assert secret is not None
        return cls(public, secret, authorized)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Makes ``sock`` a CURVE server (call before ``bind``)."""
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SERVER, 1)

    def __repr__(self) -> str:  # never print a secret
        return f"ServerKeys(public={self.public.decode()!r}, authorized_dir={str(self.authorized_dir)!r})"


def as_server_keys(name: str, value: object) -> ServerKeys | None:
    """``value`` as server keys: ``None``, a ``ServerKeys``, or a key directory (``acollect keys DIR``), loaded.

    Raises:
        ConfigurationError: anything else (named ``name``), or a directory without the collector's keys.
    """
    if value is None or isinstance(value, ServerKeys):
        return value
    if isinstance(value, (str, os.PathLike)):
        return ServerKeys.load(value)
    raise ConfigurationError.bad_value(name, value, "None, a key directory (`acollect keys DIR`) or a ServerKeys")


@dataclass(frozen=True)
class ClientKeys:
    """A worker's key pair and the collector's public key."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, directory: str | os.PathLike[str], name: str = "worker") -> ClientKeys:
        """Reads ``<name>.key_secret`` and ``collector.key`` from a key directory.

        Raises:
            ConfigurationError: a file is missing or unreadable, or no CURVE support.
        """
        _require_curve()
        root = Path(directory)
        public, secret = _load(root / f"{_check_name(name)}.key_secret", secret=True)
        server_public, _ = _load(root / f"{COLLECTOR_KEY_NAME}.key", secret=False)
        assert secret is not None
        return cls(public, secret, server_public)

    @classmethod
    def fresh(cls, server_public: bytes) -> ClientKeys:
        """A new key pair (in memory, never written) for a client of the server whose public key is given."""
        _require_curve()
        public, secret = zmq.curve_keypair()
        return cls(public, secret, server_public)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Makes ``sock`` a CURVE client of the collector (call before ``connect``)."""
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)

    def __repr__(self) -> str:  # never print a secret
        return f"ClientKeys(public={self.public.decode()!r}, server_public={self.server_public.decode()!r})"


class AllowList:
    """A ZAP handler (in a thread of its own) that accepts the public keys found in a directory.

    Refused keys are counted in :attr:`rejected_keys`. The handler must run in the
    same ZeroMQ context as the sockets it guards.
    """

    def __init__(self, context: zmq.Context[Any], directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._rejected: dict[bytes, int] = {}
        self._extra: set[bytes] = set()  # keys allowed in memory only (the collector's own local workers)
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        # Every domain: a socket without a ZAP domain uses "*" here.
        self._auth.configure_curve_callback("*", self)

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the authenticator thread with a peer's z85 public key."""
        try:
            allowed = key in self._extra or key in zmq.auth.load_certificates(self.directory)
        except (OSError, ValueError):
            allowed = False  # an unreadable allow-list accepts nobody
        if not allowed:
            with self._lock:
                self._rejected[key] = self._rejected.get(key, 0) + 1
        return allowed

    def allow(self, public: bytes) -> None:
        """Accepts this z85 public key too, for as long as the handler runs (not written anywhere)."""
        self._extra.add(public)

    @property
    def rejected_keys(self) -> dict[str, int]:
        """Public keys (z85) refused so far and how many times each was."""
        with self._lock:
            return {k.decode(): n for k, n in self._rejected.items()}

    def stop(self) -> None:
        """Stops the handler thread (idempotent)."""
        if self._auth.is_alive():
            self._auth.stop()
