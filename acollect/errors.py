"""The exceptions acollect raises, in one tree.

Every error acollect raises on purpose derives from :class:`AcollectError`, so
``except AcollectError`` catches them all while cancellation and programming
errors pass through untouched::

    AcollectError
    ├── ConfigurationError          (also a ValueError) bad argument: names it, the value, what was expected
    ├── CollectorStateError         an illegal move in the lifecycle (e.g. start() twice)
    │   └── ClosedCollectorError    *you* closed the collector: async_shutdown() was called
    ├── BackgroundCollectionError   the background task died; raised at the next call, never lost
    ├── EnvError                    an env broke its contract (wrong shapes, closed env, …)
    ├── PolicyError                 the policy broke its contract (no "action", wrong shape, a pass that hangs, …)
    │   └── InferencePolicyError    (also an InferenceServerError) the policy raised in the inference server process
    ├── WorkerError                 something *else* broke the collector: a worker
    │   ├── WorkerCrashedError      the worker process died (exit code / signal)
    │   ├── WorkerTimeoutError      the worker stopped sending heartbeats (hung)
    │   └── RemoteError             an exception inside the worker (original type name + traceback)
    ├── InferenceServerError        something *else* broke the collector: its inference server process died
    │   │                           (exit code / signal) or failed (type name + traceback); pid, exit code
    │   └── InferencePolicyError    the failure was its policy's (see above: also a PolicyError)
    ├── EmptyBufferError            (also an IndexError) sampling a replay buffer that holds nothing
    ├── WeightSyncError             a weight push was not acknowledged in time (names the workers)
    └── TransportError              the wire broke (ZeroMQ, shared memory)
        └── ProtocolError           a malformed, replayed or incompatible message

"Closed" and "broken" are two different exceptions on purpose: a
:class:`ClosedCollectorError` means the caller shut the collector down, a
:class:`WorkerError` or an :class:`InferenceServerError` means something else broke it.
``except PolicyError`` catches a policy that raised in the inference server process
(:class:`InferencePolicyError`), and not that process's death.
"""

from __future__ import annotations

import signal

__all__ = [
    "AcollectError",
    "BackgroundCollectionError",
    "ClosedCollectorError",
    "CollectorStateError",
    "ConfigurationError",
    "EmptyBufferError",
    "EnvError",
    "InferencePolicyError",
    "InferenceServerError",
    "PolicyError",
    "ProtocolError",
    "RemoteError",
    "TransportError",
    "WeightSyncError",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerTimeoutError",
    "describe_exit",
]


class AcollectError(Exception):
    """Base class of every error acollect raises on purpose."""


class ConfigurationError(AcollectError, ValueError):
    """An argument has a value acollect cannot work with.

    The message names the argument, the value given and what was expected.

    Examples:
        >>> from acollect.errors import ConfigurationError
        >>> raise ConfigurationError.bad_value("frames_per_batch", -3, "a positive int")
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: frames_per_batch=-3 is invalid: expected a positive int.
    """

    @classmethod
    def bad_value(cls, name: str, value: object, expected: str) -> ConfigurationError:
        """Builds the standard message: ``name=value is invalid: expected ...``."""
        return cls(f"{name}={value!r} is invalid: expected {expected}.")


class CollectorStateError(AcollectError):
    """The collector cannot do this in its current state (e.g. ``start()`` twice)."""


class ClosedCollectorError(CollectorStateError):
    """The collector was shut down by its owner and cannot be used any more."""


class BackgroundCollectionError(AcollectError):
    """The background collection task failed; the original error is its ``__cause__``."""


class EnvError(AcollectError):
    """An environment broke its contract (bad shapes, used after close, ...)."""


class PolicyError(AcollectError):
    """A policy broke its contract (did not write ``"action"``, wrong shape, ...)."""


class InferenceServerError(AcollectError):
    """The inference server process broke the collector (or its in-process callers): it died, or failed.

    Something else than the caller broke it, as a worker's death is (:class:`WorkerError`): it is no
    :class:`PolicyError`, unless the failure was the policy's (:class:`InferencePolicyError`).

    Attributes:
        pid: the server process's id.
        exitcode: its exit code once known (negative: killed by that signal number), else ``None``.
        type_name: the qualified name of the exception raised there (``""`` if it died without one).
        remote_traceback: the traceback formatted there (``""`` if none).
    """

    def __init__(
        self,
        message: str,
        *,
        pid: int | None = None,
        exitcode: int | None = None,
        type_name: str = "",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode
        self.type_name = type_name
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        base = super().__str__()
        if self.remote_traceback:
            return f"{base}\n\nTraceback in the inference server process (pid {self.pid}):\n{self.remote_traceback}"
        return base


class InferencePolicyError(InferenceServerError, PolicyError):
    """The policy raised in the inference server process: while the server built it, or in a forward pass.

    Both a :class:`PolicyError` (``except PolicyError`` catches it) and an :class:`InferenceServerError` (with the
    server's ``pid``, the exception's ``type_name`` and the ``remote_traceback``).

    Examples:
        >>> err = InferencePolicyError("the policy raised", pid=7, type_name="builtins.ValueError")
        >>> isinstance(err, PolicyError), isinstance(err, InferenceServerError), err.type_name
        (True, True, 'builtins.ValueError')
    """


class WorkerError(AcollectError):
    """A worker broke the collector.

    Attributes:
        worker_id: index of the worker that failed, or ``None`` if unknown.
    """

    def __init__(self, message: str, *, worker_id: int | None = None) -> None:
        super().__init__(message)
        self.worker_id = worker_id


class WorkerCrashedError(WorkerError):
    """A worker process died.

    Attributes:
        exitcode: the process exit code (negative: killed by that signal number).
    """

    def __init__(self, message: str, *, worker_id: int | None = None, exitcode: int | None = None) -> None:
        super().__init__(message, worker_id=worker_id)
        self.exitcode = exitcode


class WorkerTimeoutError(WorkerError):
    """A worker sent no heartbeat within the configured timeout (it is hung)."""


class RemoteError(WorkerError):
    """An exception was raised inside a worker.

    Attributes:
        type_name: the qualified name of the original exception type.
        remote_traceback: the worker's formatted traceback.
    """

    def __init__(
        self,
        message: str,
        *,
        worker_id: int | None = None,
        type_name: str = "",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message, worker_id=worker_id)
        self.type_name = type_name
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        base = super().__str__()
        if self.remote_traceback:
            return f"{base}\n\nRemote traceback (worker {self.worker_id}):\n{self.remote_traceback}"
        return base


class EmptyBufferError(AcollectError, IndexError):
    """Sampling was asked of a replay buffer that holds no transitions yet."""


class WeightSyncError(AcollectError):
    """A weight update was not acknowledged by every targeted worker in time.

    Attributes:
        worker_ids: the workers that did not acknowledge.
    """

    def __init__(self, message: str, *, worker_ids: list[int] | tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.worker_ids = tuple(worker_ids)


class TransportError(AcollectError):
    """The transport between the collector and its workers failed."""


class ProtocolError(TransportError):
    """A message was malformed, replayed, oversized or of another protocol version."""


def describe_exit(exitcode: int | None) -> str:
    """Says how a process ended.

    Examples:
        >>> describe_exit(-9)
        'killed by signal 9 (SIGKILL)'
        >>> describe_exit(1)
        'exit code 1'
    """
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-exitcode} ({name})"
    return f"exit code {exitcode}"
