"""The ``config`` message: a :class:`~acollect._workers.protocol.WorkerConfig` for a worker started by hand.

A worker that joins a collector (:mod:`acollect._workers.remote`) gets its config over the
connection. The collector encodes it (:func:`encode_config`), the worker decodes it
(:func:`decode_config`), and both sides name factories by import path
(:func:`resolve_import_path`), which every worker also uses to build its env and policy.

The config travels as plain msgpack fields when it can: env and policy factories named by
import path (``"pkg.module:make_env"``) or gymnasium id, no policy object. Otherwise it is
cloudpickled, and a worker unpickles it only because the collector proved its identity during
the CURVE handshake; a worker started with ``allow_pickle=False`` (``--no-pickle``) refuses that too.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any

import cloudpickle
import msgpack
import torch
from tensordict import TensorDict, TensorDictBase

from acollect._pickling import cloudpickle_dumps
from acollect._policy import parse_exploration_type
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.auth import ClientKeys
from acollect._workers import protocol as P
from acollect.errors import ConfigurationError, ProtocolError

__all__ = ["decode_config", "encode_config", "is_import_path", "resolve_import_path"]

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# Filled in by the worker itself, never taken from the collector.
_LOCAL_FIELDS = ("address", "parent_pid", "remote", "keys", "pipe")


def is_import_path(value: Any) -> bool:
    """Whether ``value`` is a ``"pkg.module:attr"`` string (which a worker resolves), not a gymnasium id.

    Examples:
        >>> is_import_path("acollect.testing:CountingEnv"), is_import_path("CartPole-v1")
        (True, False)
    """
    return isinstance(value, str) and _IMPORT_PATH.match(value) is not None


def resolve_import_path(value: Any) -> Any:
    """``"pkg.module:attr"`` -> that attribute; anything else (a gymnasium id, a callable) as it is.

    Examples:
        >>> import os.path
        >>> resolve_import_path("os.path:join") is os.path.join
        True
        >>> resolve_import_path("CartPole-v1")
        'CartPole-v1'
    """
    if not is_import_path(value):
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
    if config.inference is not None and "keys" in config.inference:
        # No secret key on the wire: a worker started by hand uses its own keys for the inference server too.
        config = dataclasses.replace(config, inference={k: v for k, v in config.inference.items() if k != "keys"})
    plain = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _LOCAL_FIELDS}
    if config.rollout is not None:  # its fields, as msgpack carries them (devices and the interaction type by name)
        rollout = {f.name: getattr(config.rollout, f.name) for f in dataclasses.fields(config.rollout)}
        rollout["devices"] = {k: (None if v is None else str(v)) for k, v in rollout["devices"].items()}
        rollout["env_kwargs"] = dict(rollout["env_kwargs"])
        exploration = rollout["exploration_type"]
        rollout["exploration_type"] = exploration.name if exploration is not None else None
        plain["rollout"] = rollout
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
    payload = bytearray(cloudpickle_dumps(dataclasses.replace(config, keys=None)))
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
        plain = dict(fields["plain"])
        if plain.get("rollout") is not None:
            rollout = dict(plain["rollout"])
            rollout["exploration_type"] = parse_exploration_type(rollout["exploration_type"])
            plain["rollout"] = RolloutSpec(**rollout)
        config = P.WorkerConfig(address=address, parent_pid=0, **plain)
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
