"""The ``acollect`` command: a dispatcher over subcommand modules.

Each subcommand is a module of this package with two functions:

* ``add_parser(subparsers)``: adds its parser with ``subparsers.add_parser(name, ...)``, its
  arguments, and ``set_defaults(run=run)``;
* ``run(args) -> int``: does the work and returns the exit code.

and is registered by its module name in :data:`COMMANDS`. A module imports heavy
dependencies inside ``run``, so ``acollect --help`` stays quick.

Examples:
    >>> build_parser().parse_args(["info", "--json"]).command
    'info'
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from acollect.errors import AcollectError

__all__ = ["COMMANDS", "build_parser", "main"]

#: Subcommand modules, in the order ``acollect --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "acollect.cli._info",
    "acollect.cli._bench",
    "acollect.cli._keys_cmd",
    "acollect.cli._worker_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``acollect`` parser with every registered subcommand."""
    from acollect import __version__

    parser = argparse.ArgumentParser(
        prog="acollect",
        description="Asyncio-first reinforcement-learning data collection: tools for this machine.",
    )
    parser.add_argument("--version", action="version", version=f"acollect {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v: INFO, -vv: DEBUG) on stderr")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``acollect`` with ``argv`` (default: the process's arguments) and returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("acollect: interrupted", file=sys.stderr)
        return 130
    except AcollectError as exc:
        # acollect's own errors say what was wrong; a traceback would only bury that.
        print(f"acollect {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
