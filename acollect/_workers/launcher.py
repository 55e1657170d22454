"""The launcher interface: where a multi-process collector's workers run.

Public as :mod:`acollect.launchers.base`, whose docstring describes it for users.
"""

from __future__ import annotations

import abc
import os
import pickle
import socket
import sys
from typing import Protocol, runtime_checkable

from acollect._pickling import cloudpickle_dumps
from acollect._workers.protocol import WorkerConfig
from acollect.errors import ConfigurationError

__all__ = [
    "LaunchedWorker",
    "Launcher",
    "describe_engine_exit",
    "engine_error",
    "pack_config",
    "run_packed_config",
]


@runtime_checkable
class LaunchedWorker(Protocol):
    """One started worker, as its launcher sees it."""

    @property
    def pid(self) -> int | None:
        """The worker's process id where the launcher knows it (``None`` otherwise)."""
        ...

    @property
    def exitcode(self) -> int | None:
        """``None`` while the worker runs; its exit code once it ended (negative: killed by a signal)."""
        ...

    @property
    def alive(self) -> bool:
        """Whether the worker still runs."""
        ...

    def write_config(self) -> None:
        """Hands the config over when the launcher did not at start (blocking: called off the event loop)."""
        ...

    def terminate(self) -> None:
        """Asks the worker to end (SIGTERM or the engine's equivalent); no-op once it ended."""
        ...

    def kill(self) -> None:
        """Ends the worker now; no-op once it ended."""
        ...

    def close(self) -> None:
        """Releases what the handle holds (called once the worker ended, or was given up on)."""
        ...

    def describe(self) -> str:
        """A few words that identify the worker in error messages, e.g. ``"pid 1234"``."""
        ...


class Launcher(abc.ABC):
    """Starts worker processes for a collector.

    Subclasses implement :meth:`start`; the collector calls :meth:`prepare` once (off the event
    loop) before binding its endpoint, :meth:`start` (off the event loop) for every worker and
    every restart, and :meth:`close` after all its workers ended.
    """

    #: Short name used in messages and ``repr``.
    name: str = "launcher"
    #: Whether every worker runs on this host (then ipc endpoints and shared memory work).
    same_host: bool = False
    #: Whether :meth:`prepare` must run on the event loop's thread instead of a short-lived one (it may
    #: start processes that die with the thread that started them).
    prepare_on_loop_thread: bool = False

    def prepare(self) -> None:  # noqa: B027 - optional hook, most launchers need nothing
        """Connects to the engine (e.g. ``ray.init``). Blocking; called once per start, off the event loop
        unless :attr:`prepare_on_loop_thread`."""

    def node_ip(self) -> str:
        """This host's address as the workers reach it (the host name's address, else loopback)."""
        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
        return ip

    def default_address(self) -> str | None:
        """Where the collector binds when given no ``address`` (``None``: a private ipc path)."""
        return None if self.same_host else f"tcp://{self.node_ip()}:0"

    def connect_address(self, bound: str) -> str:
        """The address workers connect to, given the one the collector bound.

        A wildcard bind (``tcp://0.0.0.0:port``) is reachable at :meth:`node_ip`.
        """
        for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
            if bound.startswith(wildcard):
                return f"tcp://{self.node_ip()}:{bound[len(wildcard) :]}"
        return bound

    def check_address(self, address: str | None) -> None:
        """Rejects an endpoint address the workers could not reach.

        Raises:
            ConfigurationError: an ipc address with workers on other hosts.
        """
        if address is not None and not self.same_host and not address.startswith("tcp://"):
            raise ConfigurationError.bad_value(
                "address",
                address,
                f"a 'tcp://<host>:<port>' address (the {self.name} launcher's workers may run "
                "on other hosts), or None for the default",
            )

    @abc.abstractmethod
    def start(self, config: WorkerConfig) -> LaunchedWorker:
        """Starts one worker for ``config`` (blocking: called off the event loop)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases what the launcher holds once its workers ended. Idempotent."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def pack_config(config: WorkerConfig) -> bytes:
    """Packs a config for a worker started by an engine (Ray, submitit): see :func:`run_packed_config`.

    Raises:
        ConfigurationError: the env factory or policy cannot be pickled.
    """
    try:
        body = cloudpickle_dumps(config)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot send the env factory or policy to worker {config.index}: {type(exc).__name__}: {exc} "
            "(it must be picklable with cloudpickle; pass policy_factory to build the policy inside the worker)"
        ) from exc
    return pickle.dumps((list(sys.path), socket.gethostname(), body))


def run_packed_config(payload: bytes) -> int:
    """Runs one worker from :func:`pack_config`'s bytes; returns its exit code.

    The payload comes from the collector through the engine's own channel (Ray's object
    store, submitit's job folder), never from the collector's socket. The collector's import
    path is added, so factories defined in the trainer's modules import here as they did there.
    A worker on the collector's host watches the collector's pid and exits when it is gone; on
    another host it exits when the collector's heartbeats stop (see :mod:`acollect._workers.main`).
    """
    path, host, body = pickle.loads(payload)
    sys.path[:0] = [p for p in path if p not in sys.path and os.path.isdir(p)]
    config: WorkerConfig = pickle.loads(body)
    if host != socket.gethostname():
        import dataclasses

        config = dataclasses.replace(config, parent_pid=0)
    from acollect._workers.main import run_worker

    return run_worker(config)


def engine_error(exc: BaseException) -> str:
    """A one-line reason from an engine's exception (its first line, without the traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def describe_engine_exit(what: str, exitcode: int | None, reason: str | None) -> str:
    """``"Ray actor 1a2b (ended: ActorDiedError: ...)"``-style descriptions for engine workers."""
    if exitcode is None:
        return what
    return f"{what} (ended: {reason})" if reason else what
