"""Workers started by hand: join a collector over an authenticated connection, get a config, collect.

``acollect worker --connect tcp://HOST:PORT --keys DIR`` calls :func:`run_remote_worker`:

1. it connects a socket of its own to the collector as a CURVE client (the
   collector must hold the secret half of ``collector.key``, and this worker's
   public key must be on the collector's allow-list);
2. it sends ``join``; the collector answers ``config`` with a free worker slot
   (index and generation) and that slot's :class:`~acollect.worker.protocol.WorkerConfig`;
3. it runs the ordinary worker loop of :mod:`acollect.worker.main` under that
   identity, with its own keys, until the collector says ``stop``.

The config travels as plain msgpack fields when it can: env and policy
factories named by import path (``"pkg.module:make_env"``) or gymnasium id, no
policy object. Otherwise it is cloudpickled, and a worker unpickles it only
because the collector proved its identity during the CURVE handshake; start the
worker with ``allow_pickle=False`` (``--no-pickle``) to refuse that too.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import secrets
import socket
import time
from typing import Any

import cloudpickle
import msgpack
import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ConfigurationError, ProtocolError
from acollect.transport.auth import ClientKeys
from acollect.transport.endpoint import WorkerSocket
from acollect.transport.wire import PROTOCOL_VERSION, pack_message, unpack_message
from acollect.worker import protocol as P

__all__ = ["decode_config", "encode_config", "join", "resolve_import_path", "run_remote_worker"]

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# Filled in by the worker itself, never taken from the collector.
_LOCAL_FIELDS = ("address", "parent_pid", "remote", "keys")


def resolve_import_path(value: Any) -> Any:
    """``"pkg.module:attr"`` -> that attribute; anything else (a gymnasium id, a callable) as it is.

    Examples:
        >>> resolve_import_path("os.path:join") is os.path.join
        True
        >>> resolve_import_path("CartPole-v1")
        'CartPole-v1'
    """
    if not isinstance(value, str) or not _IMPORT_PATH.match(value):
        return value
    module_name, _, attr = value.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} named by {value!r}: {exc}") from exc
    missing = object()
    for part in attr.split("."):
        obj = getattr(obj, part, missing)
        if obj is missing:
            raise ConfigurationError(f"{value!r}: module {module_name!r} has no attribute {attr!r}")
    return obj


def encode_config(config: P.WorkerConfig, *, allow_pickle: bool) -> tuple[dict[str, Any], TensorDict | None]:
    """The ``config`` message for ``config``: ``plain`` header fields if msgpack can carry them, else a
    ``pickled`` flag and the pickle as a raw ``uint8`` frame (a policy may weigh megabytes)."""
    plain = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _LOCAL_FIELDS}
    plain["devices"] = {k: (None if v is None else str(v)) for k, v in plain["devices"].items()}
    try:
        msgpack.packb(plain)
    except (TypeError, ValueError, OverflowError):
        pass
    else:
        return {"plain": plain}, None
    if not allow_pickle:
        return {
            "refused": "this collector's env factory or policy is a Python object, and the worker refuses "
            "pickled configs: name the factories by import path ('pkg.module:make_env') and pass "
            "policy_factory by import path, or start the worker without --no-pickle"
        }, None
    payload = bytearray(cloudpickle.dumps(dataclasses.replace(config, keys=None)))
    return {"pickled": True}, TensorDict({"pickled": torch.frombuffer(payload, dtype=torch.uint8)}, batch_size=[])


def decode_config(
    fields: dict[str, Any],
    td: TensorDictBase | None,
    *,
    address: str,
    keys: ClientKeys,
    allow_pickle: bool,
    authenticated: bool,
) -> P.WorkerConfig:
    """Builds this worker's config from a ``config`` message.

    Raises:
        ConfigurationError: the collector refused, or sent a pickled config that may not be unpickled.
    """
    if "refused" in fields:
        raise ConfigurationError(f"the collector at {address} refused this worker: {fields['refused']}")
    if "plain" in fields:
        config = P.WorkerConfig(address=address, parent_pid=0, **fields["plain"])
    elif fields.get("pickled"):
        if not (allow_pickle and authenticated):
            why = "--no-pickle was given" if authenticated else "the collector is not authenticated"
            raise ConfigurationError(f"the collector at {address} sent a pickled config, not unpickled: {why}")
        if td is None or "pickled" not in td.keys():
            raise ProtocolError("a pickled config message without its payload frame")
        config = cloudpickle.loads(td.get("pickled").numpy().tobytes())
    else:
        raise ProtocolError("a config message with neither 'plain' nor 'pickled' fields")
    if config.index != fields.get("index") or config.generation != fields.get("generation"):
        raise ProtocolError("the config names another worker slot than its message")
    return dataclasses.replace(config, address=address, parent_pid=0, remote=True, keys=keys)


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
    from acollect.worker.main import run_worker

    return run_worker(join(address, keys, timeout=join_timeout, allow_pickle=allow_pickle))
