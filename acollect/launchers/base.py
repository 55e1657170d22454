"""The launcher interface: where a multi-process collector's workers run.

A collector binds one ZeroMQ endpoint and asks its launcher to start one worker
per :class:`~acollect._workers.protocol.WorkerConfig`. The launcher decides where
(a local process, a Ray actor, a submitit job) and returns a
:class:`LaunchedWorker`, the handle the collector's monitor polls for liveness
and ends at shutdown. Everything else (batches, weights, heartbeats) goes over
the endpoint, whatever the launcher.

Launchers whose workers may run on other hosts bind a tcp endpoint: by default on
:meth:`Launcher.node_ip` with a free port (reachable from the cluster, not from
every interface); pass ``address="tcp://0.0.0.0:<port>"`` to a collector to
listen on all interfaces.

This is the public name of :mod:`acollect._workers.launcher`, where the code lives with the rest of its flow."""

from acollect._workers.launcher import LaunchedWorker as LaunchedWorker
from acollect._workers.launcher import Launcher as Launcher
from acollect._workers.launcher import describe_engine_exit as describe_engine_exit
from acollect._workers.launcher import engine_error as engine_error
from acollect._workers.launcher import pack_config as pack_config
from acollect._workers.launcher import run_packed_config as run_packed_config

__all__ = [
    "LaunchedWorker",
    "Launcher",
    "describe_engine_exit",
    "engine_error",
    "pack_config",
    "run_packed_config",
]
