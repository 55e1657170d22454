"""``acollect keys DIR``: CURVE key pairs for a collector and the workers allowed to join it.

Writes ``collector.key``/``collector.key_secret``, one pair per worker name, and
copies each worker's public key into ``DIR/authorized/``, the collector's
allow-list (see :mod:`acollect.transport.auth`). Run it again with new names to
add workers; delete a file from ``authorized/`` to revoke one.

Examples:
    >>> import argparse
    >>> sub = argparse.ArgumentParser().add_subparsers()
    >>> add_parser(sub).parse_args(["--worker", "a", "--worker", "b"]).worker
    ['a', 'b']
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``acollect keys``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "keys",
        help="create CURVE key pairs for a collector and its remote workers",
        description=(
            "Creates a key directory: the collector's key pair (once), one key pair per worker name, and the "
            "allow-list DIR/authorized/ of worker public keys the collector accepts. Give a worker machine "
            "DIR/collector.key and its own NAME.key_secret; keep collector.key_secret on the collector's machine."
        ),
    )
    parser.add_argument("directory", metavar="DIR", nargs="?", default="acollect-keys", help="key directory")
    parser.add_argument(
        "--worker", metavar="NAME", action="append", help="a worker key name (repeatable; default: 'worker')"
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Writes the keys and lists the files."""
    from acollect._runtime.auth import create_keys

    written = create_keys(args.directory, workers=tuple(args.worker or ["worker"]))
    for path in written:
        print(f"{'secret' if path.suffix == '.key_secret' else 'public'}  {path}")
    return 0
