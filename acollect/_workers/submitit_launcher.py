"""The submitit launcher: each worker is a submitit job (SLURM on a cluster, a local process here).

submitit pickles the job (the worker's config) into a job folder, which must be
on a filesystem the compute nodes share when jobs go to SLURM. Each job runs the
ordinary worker loop and connects back to the collector's ZeroMQ endpoint over tcp.

:func:`submitit_delayed_launcher` goes one step further for clusters where the
trainer itself must be a job: called on a login node, it submits the trainer, and
the trainer, once it runs (so once its address is known), submits its workers.
"""

from __future__ import annotations

import functools
import inspect
import pickle
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from acollect._workers.launcher import Launcher, describe_engine_exit, pack_config, run_packed_config
from acollect._workers.protocol import WorkerConfig
from acollect.errors import ConfigurationError

__all__ = ["SubmititLauncher", "SubmititWorker", "submitit_delayed_launcher"]

#: Job time limit (minutes) unless ``executor_options`` sets ``timeout_min``: submitit's own default
#: (5 minutes) would end workers mid-training.
DEFAULT_TIMEOUT_MIN = 60 * 24
_CLUSTERS = (None, "local", "slurm")


def _submitit() -> Any:
    try:
        import submitit
    except ImportError as exc:
        raise ConfigurationError(
            "launcher='submitit' needs submitit: pip install 'acollect[submitit]' (or pip install submitit)"
        ) from exc
    return submitit


def _make_executor(folder: str | Path, cluster: str | None, options: Mapping[str, Any]) -> Any:
    """An ``AutoExecutor`` for ``cluster`` (``None``: SLURM when available, else local)."""
    submitit = _submitit()
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    params = {"timeout_min": DEFAULT_TIMEOUT_MIN, **options}
    try:
        executor.update_parameters(**params)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigurationError.bad_value("executor options", params, f"options submitit accepts ({exc})") from exc
    return executor


def _check_options(name: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError.bad_value(name, value, "None or a dict of submitit executor options")
    return dict(value)


def _slurm_options(slurm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    # AutoExecutor takes SLURM-only options as slurm_<name>; accept both spellings.
    return {k if k.startswith("slurm_") else f"slurm_{k}": v for k, v in slurm_kwargs.items()}


class SubmititWorker:
    """One worker running as a submitit job."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self._code: int | None = None
        self._reason: str | None = None
        # The exit code a job that ends without its result reads as: 1, or -2 once cancelled here.
        self._code_if_failed = 1

    @property
    def pid(self) -> int | None:
        """Not known to the collector (the job may run on another node)."""
        return None

    @property
    def exitcode(self) -> int | None:
        """``None`` while the job runs; the worker's exit code, or ``1`` (``-2`` if cancelled here) otherwise."""
        if self._code is not None:
            return self._code
        if not self.job.done():
            return None
        # Read the result file directly: job.result() may wait seconds for it, and this runs on the event loop.
        path = Path(self.job.paths.result_pickle)
        outcome: Any = None
        if path.exists():
            try:
                with open(path, "rb") as f:
                    outcome = pickle.load(f)
            except (OSError, EOFError, pickle.UnpicklingError):
                outcome = None
        if isinstance(outcome, tuple) and len(outcome) == 2 and outcome[0] == "success":
            self._code = int(outcome[1])
            self._reason = f"exit code {self._code}"
        else:
            self._code = self._code_if_failed
            detail = str(outcome[1]).strip().splitlines()[-1] if isinstance(outcome, tuple) else None
            self._reason = f"job state {self.job.state}" + (f", {detail}" if detail else "")
            self._reason += f"; its log: {self.job.paths.stderr}"
        return self._code

    @property
    def alive(self) -> bool:
        """Whether the job still runs."""
        return self.exitcode is None

    def write_config(self) -> None:
        """No-op: the config is in the job's folder."""

    def terminate(self) -> None:
        """Cancels the job (SIGINT to a local job, ``scancel`` on SLURM)."""
        if self.exitcode is None:
            self._code_if_failed = -2
            try:
                self.job.cancel(check=False)
            except Exception:  # already gone, or scancel failed: the job's own time limit remains
                pass

    def kill(self) -> None:
        """Cancels the job (the engine has one way to end it)."""
        self.terminate()

    def close(self) -> None:
        """Cancels the job if it still runs."""
        self.terminate()

    def describe(self) -> str:
        """``"submitit job <id>"``, with how it ended once it did."""
        return describe_engine_exit(f"submitit job {self.job.job_id}", self._code, self._reason)


class SubmititLauncher(Launcher):
    """Starts each worker as a submitit job.

    Args:
        folder: where submitit keeps job files and logs; on SLURM, a folder the nodes share (required
            there). ``None`` with the local executor: a temporary folder, removed at shutdown.
        cluster: ``"slurm"``, ``"local"``, or ``None`` for SLURM when this host can submit to it, else local.
        slurm_kwargs: SLURM options (``partition``, ``account``, ``qos``... with or without the ``slurm_``
            prefix), ignored by the local executor.
        executor_options: generic submitit options (``timeout_min``, ``cpus_per_task``, ``gpus_per_node``,
            ``mem_gb``, ``name``...). ``timeout_min`` defaults to a day (submitit's 5 minutes would end
            workers mid-training).
        port: the tcp port the collector binds by default (``0``: any free port).
        max_jobs: the most worker jobs running at once (``None``: no limit).

    Raises:
        ConfigurationError: a bad argument.

    Examples:
        >>> SubmititLauncher(cluster="local", executor_options={"timeout_min": 30})
        SubmititLauncher(cluster='local', executor_options={'timeout_min': 30})
    """

    name = "submitit"
    same_host = False

    def __init__(
        self,
        folder: str | Path | None = None,
        *,
        cluster: str | None = None,
        slurm_kwargs: Mapping[str, Any] | None = None,
        executor_options: Mapping[str, Any] | None = None,
        port: int = 0,
        max_jobs: int | None = None,
    ) -> None:
        if cluster not in _CLUSTERS:
            raise ConfigurationError.bad_value("cluster", cluster, f"one of {_CLUSTERS}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigurationError.bad_value("port", port, "an int in [0, 65536)")
        if max_jobs is not None and (isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1):
            raise ConfigurationError.bad_value("max_jobs", max_jobs, "None or an int >= 1")
        self.folder = None if folder is None else Path(folder)
        self.cluster = cluster
        self.slurm_kwargs = _check_options("slurm_kwargs", slurm_kwargs)
        self.executor_options = _check_options("executor_options", executor_options)
        self.port = port
        self.max_jobs = max_jobs
        self._executor: Any = None
        self._tmp_folder: str | None = None
        self._workers: list[SubmititWorker] = []

    @property
    def job_folder(self) -> Path | None:
        """Where the jobs' files and logs are: ``folder``, or for the local executor without one the temporary
        folder made at start-up (removed when the launcher closes, at the collector's shutdown); ``None`` while
        there is none."""
        if self.folder is not None:
            return self.folder
        return Path(self._tmp_folder) if self._tmp_folder is not None else None

    def prepare(self) -> None:
        """Builds the executor (and a temporary job folder for the local executor)."""
        if self._executor is not None:
            return
        cluster = self.cluster or _submitit().AutoExecutor.which()
        folder = self.folder
        if folder is None:
            if cluster == "slurm":
                raise ConfigurationError.bad_value("folder", None, "a job folder on a filesystem the SLURM nodes share")
            folder = Path(self._tmp_folder or tempfile.mkdtemp(prefix="acollect-submitit-"))
            self._tmp_folder = str(folder)
        options = {**self.executor_options, **_slurm_options(self.slurm_kwargs)}
        self._executor = _make_executor(folder, cluster, options)

    def default_address(self) -> str:
        """``tcp://<this host's address>:<port>``."""
        return f"tcp://{self.node_ip()}:{self.port}"

    def start(self, config: WorkerConfig) -> SubmititWorker:
        """Submits the worker's job (returns once submitted; the scheduler starts it when it can)."""
        self.prepare()
        self._workers = [w for w in self._workers if w.exitcode is None]
        if self.max_jobs is not None and len(self._workers) >= self.max_jobs:
            raise ConfigurationError.bad_value("max_jobs", self.max_jobs, f"at least {len(self._workers) + 1} jobs")
        job = self._executor.submit(run_packed_config, pack_config(config))
        worker = SubmititWorker(job)
        self._workers.append(worker)
        return worker

    def close(self) -> None:
        """Cancels jobs still running and removes the temporary job folder. Idempotent."""
        for worker in self._workers:
            worker.close()
        self._workers = []
        if self._tmp_folder is not None:
            shutil.rmtree(self._tmp_folder, ignore_errors=True)
            self._tmp_folder = None
        self._executor = None

    def __repr__(self) -> str:
        parts = [f"folder={str(self.folder)!r}"] if self.folder is not None else []
        parts.append(f"cluster={self.cluster!r}")
        if self.slurm_kwargs:
            parts.append(f"slurm_kwargs={self.slurm_kwargs!r}")
        if self.executor_options:
            parts.append(f"executor_options={self.executor_options!r}")
        if self.port:
            parts.append(f"port={self.port}")
        if self.max_jobs is not None:
            parts.append(f"max_jobs={self.max_jobs}")
        return f"SubmititLauncher({', '.join(parts)})"


def _run_trainer(
    main: Callable[..., Any], launcher_options: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The trainer job: ``main(*args, launcher=SubmititLauncher(...), **kwargs)``, awaited if it is async."""
    launcher = SubmititLauncher(**launcher_options)
    try:
        if inspect.iscoroutinefunction(main):
            import anyio

            return anyio.run(functools.partial(main, *args, launcher=launcher, **kwargs))
        return main(*args, launcher=launcher, **kwargs)
    finally:
        launcher.close()


def submitit_delayed_launcher(
    num_jobs: int | None = None,
    *,
    folder: str | Path | None = None,
    cluster: str | None = None,
    submitit_main_conf: Mapping[str, Any] | None = None,
    submitit_collection_conf: Mapping[str, Any] | None = None,
    slurm_kwargs: Mapping[str, Any] | None = None,
    tcp_port: int = 0,
    wait: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a trainer so that calling it on a login node runs it as a job, and its workers as jobs too.

    The trainer is submitted first; once it runs, it knows its node's address, and every collector
    it builds with the ``launcher`` it is handed submits its workers as jobs pointed at that address.
    So the decorated function must take a ``launcher`` keyword argument and pass it on to its
    collectors. It may be a plain or an ``async`` function.

    Args:
        num_jobs: the most worker jobs running at once (``None``: as many as the collectors ask for).
        folder: the job folder, shared by the nodes on SLURM (``None``: a temporary folder, local only).
        cluster: ``"slurm"``, ``"local"`` or ``None`` (SLURM when available).
        submitit_main_conf: submitit options of the trainer's job (e.g. ``{"timeout_min": 600,
            "gpus_per_node": 1}``).
        submitit_collection_conf: submitit options of each worker's job.
        slurm_kwargs: SLURM options shared by every job (``partition``, ``account``...).
        tcp_port: the port the trainer's collectors bind (``0``: any free port).
        wait: return the trainer's result (blocks until it ends); ``False`` returns the submitit job.

    Returns:
        A decorator.

    Examples:
        >>> @submitit_delayed_launcher(num_jobs=2, cluster="local")
        ... def train(*, launcher):
        ...     ...  # MultiSyncCollector(..., launcher=launcher)
        >>> train.__name__
        'train'
    """
    launcher_options: dict[str, Any] = {
        "folder": folder,
        "cluster": cluster,
        "slurm_kwargs": _check_options("slurm_kwargs", slurm_kwargs),
        "executor_options": _check_options("submitit_collection_conf", submitit_collection_conf),
        "port": tcp_port,
        "max_jobs": num_jobs,
    }
    SubmititLauncher(**launcher_options)  # checks the options now, on the login node
    main_options = _check_options("submitit_main_conf", submitit_main_conf)
    main_options.update(_slurm_options(launcher_options["slurm_kwargs"]))

    def decorator(main: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(main):
            raise ConfigurationError.bad_value("main", main, "a function taking a launcher= keyword argument")

        @functools.wraps(main)
        def launch(*args: Any, **kwargs: Any) -> Any:
            which = cluster or _submitit().AutoExecutor.which()
            if folder is None and which == "slurm":
                raise ConfigurationError.bad_value("folder", None, "a job folder on a filesystem the SLURM nodes share")
            job_folder = folder if folder is not None else tempfile.mkdtemp(prefix="acollect-submitit-")
            # The trainer's workers get a folder of their own inside the trainer's.
            options = {**launcher_options, "folder": Path(job_folder) / "workers", "cluster": which}
            executor = _make_executor(job_folder, which, main_options)
            job = executor.submit(_run_trainer, main, options, args, kwargs)
            if not wait:
                return job
            try:
                return job.result()
            finally:
                if folder is None:
                    shutil.rmtree(job_folder, ignore_errors=True)

        return launch

    return decorator
