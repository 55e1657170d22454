"""Workers started by hand: join a collector over an authenticated connection, get a config, collect.

``acollect worker --connect tcp://HOST:PORT --keys DIR`` calls :func:`run_remote_worker`:

1. it connects a socket of its own to the collector as a CURVE client (the
   collector must hold the secret half of ``collector.key``, and this worker's
   public key must be on the collector's allow-list);
2. it sends ``join``; the collector answers ``config`` with a free worker slot
   (index and generation) and that slot's :class:`~acollect._workers.protocol.WorkerConfig`;
3. it runs the ordinary worker loop of :mod:`acollect._workers.main` under that
   identity, with its own keys, until the collector says ``stop``.

The config travels as plain msgpack fields when it can, else cloudpickled, unpickled only
from an authenticated collector: see :mod:`acollect._workers.config_codec`. Start the worker
with ``allow_pickle=False`` (``--no-pickle``) to refuse pickled configs.
"""

from __future__ import annotations

import os
import secrets
import socket
import time

from acollect._runtime.auth import ClientKeys
from acollect._runtime.wire import PROTOCOL_VERSION, pack_message, unpack_message
from acollect._runtime.worker_socket import WorkerSocket
from acollect._workers import protocol as P
from acollect._workers.config_codec import decode_config
from acollect._workers.main import run_worker
from acollect.errors import ConfigurationError

__all__ = ["join", "run_remote_worker"]


def join(address: str, keys: ClientKeys, *, timeout: float = 60.0, allow_pickle: bool = True) -> P.WorkerConfig:
    """Asks the collector at ``address`` for a worker slot and returns its config.

    Raises:
        TimeoutError: no collector answered within ``timeout`` seconds (not running, wrong address, or
            a key it refuses: the handshake fails without a word, by design).
        ConfigurationError: the collector refused (every slot taken) or the config may not be used.
    """
    if not isinstance(keys, ClientKeys):
        raise ConfigurationError.bad_value("keys", keys, "a ClientKeys (ClientKeys.load(directory, name))")
    identity = b"j" + secrets.token_hex(8).encode()
    deadline = time.monotonic() + timeout
    with WorkerSocket(address, identity, keys=keys) as sock:
        hello = {"protocol": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(), "pickle": allow_pickle}
        try:
            sock.send(pack_message(P.JOIN, hello), timeout=timeout, copy=True)
        except TimeoutError:
            raise TimeoutError(
                f"could not connect to a collector at {address} within {timeout}s "
                "(is it running, and is this worker's public key in its authorized/ directory?)"
            ) from None
        frames = sock.recv(timeout=max(0.0, deadline - time.monotonic()))
    if frames is None:
        raise TimeoutError(f"the collector at {address} did not answer within {timeout}s")
    header, td = unpack_message(frames, kinds=frozenset({P.CONFIG}))
    return decode_config(header, td, address=address, keys=keys, allow_pickle=allow_pickle, authenticated=True)


def run_remote_worker(address: str, keys: ClientKeys, *, join_timeout: float = 60.0, allow_pickle: bool = True) -> int:
    """Joins the collector at ``address`` and collects until it says ``stop``. Returns the exit code."""
    return run_worker(join(address, keys, timeout=join_timeout, allow_pickle=allow_pickle))
