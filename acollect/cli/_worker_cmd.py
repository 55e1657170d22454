"""``acollect worker --connect tcp://HOST:PORT --keys DIR``: a worker started by hand, on any machine.

It joins a collector built with ``remote_workers=`` and ``keys=`` (see
:mod:`acollect._workers.remote`), collects until the collector stops it, and exits
0. The machine needs acollect, the env's packages, and the modules named by
import path in the collector's config.

Examples:
    >>> import argparse
    >>> sub = argparse.ArgumentParser().add_subparsers()
    >>> args = add_parser(sub).parse_args(["--connect", "tcp://10.0.0.1:5555", "--keys", "k"])
    >>> args.name, args.join_timeout, args.no_pickle
    ('worker', 60.0, False)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``acollect worker``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "worker",
        help="start a worker by hand and join a collector over authenticated tcp",
        description=(
            "Connects to a collector's endpoint as a CURVE client, takes a free worker slot and its config, "
            "and collects until the collector says stop."
        ),
    )
    parser.add_argument("--connect", metavar="ADDRESS", required=True, help="the collector's tcp://HOST:PORT")
    parser.add_argument(
        "--keys", metavar="DIR", required=True, help="key directory with NAME.key_secret and collector.key"
    )
    parser.add_argument("--name", default="worker", help="this worker's key name in DIR (default: worker)")
    parser.add_argument(
        "--join-timeout", type=float, default=60.0, metavar="SECONDS", help="give up joining after this long"
    )
    parser.add_argument(
        "--no-pickle",
        action="store_true",
        help="refuse pickled configs: the collector must name env and policy factories by import path",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Joins, collects, and exits with the worker's exit code."""
    from acollect._runtime.auth import ClientKeys
    from acollect._workers.remote import run_remote_worker
    from acollect.errors import ConfigurationError

    if not args.join_timeout > 0:
        raise ConfigurationError.bad_value("--join-timeout", args.join_timeout, "a positive number of seconds")
    keys = ClientKeys.load(args.keys, args.name)
    try:
        code = run_remote_worker(args.connect, keys, join_timeout=args.join_timeout, allow_pickle=not args.no_pickle)
    except TimeoutError as exc:
        print(f"acollect worker: {exc}", file=sys.stderr)
        return 1
    # Everything the worker owned is closed: skip the interpreter's exit, which would wait on pyzmq's
    # zero-copy garbage-collector thread (as local workers do).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
