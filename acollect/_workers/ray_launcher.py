"""The Ray launcher: each worker is a Ray actor.

``ray.init(**ray_init_config)`` connects to the cluster (an existing one, found
the way ``ray.init`` finds it, or a fresh local one) unless Ray is already
initialized in this process. Each worker becomes one actor created with
``ray.remote(**remote_config)`` (resources such as ``num_cpus``, ``num_gpus``,
``memory``, or any other ``ray.remote`` option); the actor runs the ordinary
worker loop and connects back to the collector's ZeroMQ endpoint over tcp.
Batches and weights never go through Ray's object store: only the worker's
config does, once.

Liveness: the actor's ``run`` call returns only when the worker ends, so the
collector's monitor polls that call's ObjectRef (``ray.wait(timeout=0)``). A dead
actor (killed, out of memory, node lost) resolves it with Ray's error, which the
collector reports, or restarts the worker when ``max_worker_restarts`` allows, as for
a local process. Actors are owned by the collector's process: Ray ends them if it dies.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from acollect._workers.launcher import Launcher, describe_engine_exit, engine_error, pack_config, run_packed_config
from acollect._workers.protocol import WorkerConfig
from acollect.errors import ConfigurationError

__all__ = ["DEFAULT_REMOTE_CONFIG", "RayLauncher", "RayWorker", "check_ray_init_config", "check_remote_configs"]

#: Resources of each actor unless ``remote_configs`` says otherwise.
DEFAULT_REMOTE_CONFIG: dict[str, Any] = {"num_cpus": 1}


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigurationError("launcher='ray' needs Ray: pip install 'acollect[ray]' (or pip install ray)") from exc
    return ray


class _WorkerActor:
    """The actor: one worker loop per actor, run by a single blocking call."""

    def run(self, payload: bytes) -> int:
        return run_packed_config(payload)


@functools.lru_cache(maxsize=1)
def _actor_class() -> Any:
    return _ray().remote(_WorkerActor)


def check_ray_init_config(ray_init_config: object) -> dict[str, Any] | None:
    """Validates ``ray_init_config``: ``None`` or a dict of ``ray.init`` options (returned as a dict of its own).

    Raises:
        ConfigurationError: anything else.
    """
    if ray_init_config is not None and not isinstance(ray_init_config, Mapping):
        raise ConfigurationError.bad_value("ray_init_config", ray_init_config, "None or a dict of ray.init options")
    return None if ray_init_config is None else dict(ray_init_config)


def check_remote_configs(remote_configs: object, n_workers: int | None = None) -> list[dict[str, Any]] | dict[str, Any]:
    """Validates ``remote_configs``: one dict for every actor, or a list with one per worker.

    Raises:
        ConfigurationError: not a dict or a list of dicts (of ``n_workers`` when given).
    """
    if remote_configs is None:
        return dict(DEFAULT_REMOTE_CONFIG)
    if isinstance(remote_configs, Mapping):
        if not all(isinstance(k, str) for k in remote_configs):
            raise ConfigurationError.bad_value("remote_configs", remote_configs, "a dict of ray.remote options")
        return dict(remote_configs)
    if isinstance(remote_configs, Sequence) and not isinstance(remote_configs, (str, bytes)):
        configs = list(remote_configs)
        if not all(isinstance(c, Mapping) for c in configs) or not configs:
            raise ConfigurationError.bad_value(
                "remote_configs", remote_configs, "a dict of ray.remote options, or a list of them (one per worker)"
            )
        if n_workers is not None and len(configs) != n_workers:
            raise ConfigurationError.bad_value("remote_configs", remote_configs, f"one dict, or a list of {n_workers}")
        return [dict(c) for c in configs]
    raise ConfigurationError.bad_value(
        "remote_configs", remote_configs, "a dict of ray.remote options, or a list of them (one per worker)"
    )


class RayWorker:
    """One worker running in a Ray actor: the actor handle and the ObjectRef of its ``run`` call."""

    def __init__(self, actor: Any, ref: Any) -> None:
        self.actor = actor
        self._ref = ref
        self._code: int | None = None
        self._reason: str | None = None
        self._killed = False

    @property
    def pid(self) -> int | None:
        """Not known to the collector (the actor may run on another node)."""
        return None

    @property
    def exitcode(self) -> int | None:
        """``None`` while the actor's ``run`` call runs; its result, or ``1`` (``-9`` if killed here) on error."""
        if self._code is not None:
            return self._code
        ray = _ray()
        ready, _ = ray.wait([self._ref], timeout=0)
        if not ready:
            return None
        try:
            self._code = int(ray.get(self._ref, timeout=0))
            self._reason = f"exit code {self._code}"
        except Exception as exc:  # Ray's errors: actor died, node lost, task raised
            self._code = -9 if self._killed else 1
            self._reason = engine_error(exc)
        return self._code

    @property
    def alive(self) -> bool:
        """Whether the actor's worker still runs."""
        return self.exitcode is None

    def write_config(self) -> None:
        """No-op: the config went with the actor's ``run`` call."""

    def terminate(self) -> None:
        """Kills the actor (Ray has no gentler way into a running call; ``stop`` is the collector's)."""
        self.kill()

    def kill(self) -> None:
        """Kills the actor now; no-op once it ended."""
        if self._killed:
            return
        self._killed = True
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception:  # already gone: nothing to kill
            pass

    def close(self) -> None:
        """Kills the actor if it still holds its resources (a stopped worker's actor idles otherwise)."""
        self.kill()

    def describe(self) -> str:
        """``"Ray actor <id>"``, with how it ended once it did."""
        try:
            actor_id = self.actor._actor_id.hex()[:12]
        except AttributeError:
            actor_id = "?"
        return describe_engine_exit(f"Ray actor {actor_id}", self._code, self._reason)


class RayLauncher(Launcher):
    """Starts each worker as a Ray actor that connects back to the collector over tcp.

    Args:
        ray_init_config: keyword arguments of ``ray.init`` (default: none, which finds a running
            cluster or starts a local one). Ignored when Ray is already initialized in this process.
        remote_configs: ``ray.remote`` options of each actor: one dict for all, or a list with one per
            worker (default: ``{"num_cpus": 1}``). The cluster must have the resources of every actor,
            or the missing actors never start (the collector's ``startup_timeout`` then reports them).

    Raises:
        ConfigurationError: bad ``ray_init_config`` or ``remote_configs``.

    Examples:
        >>> RayLauncher(remote_configs={"num_cpus": 1, "memory": 2 * 1024**3})
        RayLauncher(remote_configs={'num_cpus': 1, 'memory': 2147483648})
    """

    name = "ray"
    same_host = False
    # A local cluster's processes (GCS, raylet) are told to die with the thread that started them:
    # ray.init on a short-lived thread kills the cluster a minute later.
    prepare_on_loop_thread = True

    def __init__(
        self,
        ray_init_config: Mapping[str, Any] | None = None,
        remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.ray_init_config = check_ray_init_config(ray_init_config) or {}
        self.remote_configs = check_remote_configs(remote_configs)
        self.initialized_ray = False

    def prepare(self) -> None:
        """``ray.init(**ray_init_config)`` unless Ray is initialized already.

        It runs on the event loop's thread and blocks it while a local cluster starts (seconds): call
        ``ray.init()`` yourself beforehand where that matters.
        """
        ray = _ray()
        if not ray.is_initialized():
            ray.init(**self.ray_init_config)
            self.initialized_ray = True

    def node_ip(self) -> str:
        """This node's address in the Ray cluster."""
        return str(_ray().util.get_node_ip_address())

    def remote_config(self, index: int) -> dict[str, Any]:
        """The ``ray.remote`` options of worker ``index``."""
        configs = self.remote_configs
        if isinstance(configs, dict):
            return dict(configs)
        if not 0 <= index < len(configs):
            raise ConfigurationError.bad_value(
                "remote_configs", configs, f"one dict, or a list with an entry for worker {index}"
            )
        return dict(configs[index])

    def start(self, config: WorkerConfig) -> RayWorker:
        """Creates the actor and starts its worker loop (returns at once: Ray schedules the actor)."""
        self.prepare()
        options = self.remote_config(config.index)
        try:
            actor = _actor_class().options(**options).remote()
        except (TypeError, ValueError) as exc:
            raise ConfigurationError.bad_value("remote_configs", options, f"valid ray.remote options ({exc})") from exc
        ref = actor.run.remote(pack_config(config))
        return RayWorker(actor, ref)

    def shutdown_ray(self) -> None:
        """``ray.shutdown()``: ends every actor of this driver, other collectors' and replay buffers' included."""
        ray = _ray()
        if ray.is_initialized():
            ray.shutdown()

    def __repr__(self) -> str:
        init = f"ray_init_config={self.ray_init_config!r}, " if self.ray_init_config else ""
        return f"RayLauncher({init}remote_configs={self.remote_configs!r})"
