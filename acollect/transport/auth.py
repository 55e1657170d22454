"""ZeroMQ CURVE keys and the allow-list that decides which workers may connect.

A key directory, as written by :func:`create_keys` (and ``acollect keys DIR``)::

    DIR/collector.key            the collector's public key (give it to every worker)
    DIR/collector.key_secret     the collector's secret key (stays with the collector)
    DIR/<name>.key               a worker's public key
    DIR/<name>.key_secret        that worker's secret key (goes to the machine running it)
    DIR/authorized/<name>.key    the allow-list: public keys the collector accepts

The files are pyzmq's certificate format (``zmq.auth.create_certificates``); secret
files are readable by their owner only. The collector reads the allow-list again on
every connection attempt, so adding or removing a ``.key`` file in ``authorized/``
takes effect for the next connection without a restart.

Every connection to a keyed endpoint is encrypted and both ends are authenticated:
the worker proves it holds a secret key whose public half is on the allow-list (a
ZAP handler checks it), and the collector proves it holds the secret half of the
public key the worker was given.

Examples:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:  # secret keys: removed with the directory
    ...     files = create_keys(d, workers=["alice"])
    ...     print(sorted(p.name for p in files))
    ...     print(ServerKeys.load(d).authorized_dir.name, len(ClientKeys.load(d, "alice").server_public))
    ['alice.key', 'alice.key_secret', 'collector.key', 'collector.key_secret']
    authorized 40

This is the public name of :mod:`acollect._runtime.auth`, where the code lives with the rest of its flow."""

from acollect._runtime.auth import COLLECTOR_KEY_NAME as COLLECTOR_KEY_NAME
from acollect._runtime.auth import AllowList as AllowList
from acollect._runtime.auth import ClientKeys as ClientKeys
from acollect._runtime.auth import ServerKeys as ServerKeys
from acollect._runtime.auth import as_server_keys as as_server_keys
from acollect._runtime.auth import create_keys as create_keys
from acollect._runtime.auth import curve_available as curve_available

__all__ = [
    "COLLECTOR_KEY_NAME",
    "AllowList",
    "ClientKeys",
    "ServerKeys",
    "as_server_keys",
    "create_keys",
    "curve_available",
]
