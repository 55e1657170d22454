"""Device resolution for collectors, with TorchRL's rules.

``device`` fills whichever of ``env_device``, ``policy_device`` and
``storing_device`` are unset; an unset ``policy_device`` follows the policy's
own parameters, then the env; an unset ``storing_device`` follows the env.
Every device is checked to exist before anything is built, so a typo or a
missing GPU fails at construction with a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from tensordict import TensorDictBase

from acollect.errors import ConfigurationError

__all__ = [
    "DeviceLike",
    "Devices",
    "check_device",
    "cuda_ready",
    "module_device",
    "move_to",
    "order_after",
    "resolve_devices",
    "synchronize_devices",
    "wait_for_stream",
    "wait_ready",
    "with_index",
]

DeviceLike = torch.device | str | int | None

_Movable = TypeVar("_Movable", torch.Tensor, TensorDictBase)


def move_to(value: _Movable, device: torch.device) -> _Movable:
    """``value`` on ``device``, safe to read there as soon as this returns.

    A copy to an accelerator is queued without waiting (``non_blocking``): the kernels that read it are queued
    after it on the same stream. A copy to the host is waited for: the host reads it next (an env's ``numpy()``,
    a CPU policy), and a ``non_blocking`` device-to-host copy may not have landed yet when it does.

    Examples:
        >>> move_to(torch.ones(2), torch.device("cpu"))
        tensor([1., 1.])
    """
    return value.to(device, non_blocking=device.type != "cpu")


def cuda_ready(tensors: Iterable[object]) -> tuple[tuple[torch.device, Any], ...]:
    """What the caller has queued so far on the current stream of each CUDA device of ``tensors``, as an event per
    device (``(device, event)`` pairs).

    Call it on the thread that made (or last wrote) ``tensors``, at the moment it hands them over; another thread
    reads them only after :func:`wait_ready`. The caller's current stream may be a side stream (a trainer stepping
    its optimizer under ``torch.cuda.stream(s)``): the other thread's streams are not ordered after it.

    Examples:
        >>> cuda_ready([torch.ones(2)])  # CPU tensors: nothing to wait for
        ()
    """
    if not torch.cuda.is_initialized():
        return ()  # no CUDA in this process: none of the tensors is on a GPU, and nothing is looked at
    events = []
    for device in _cuda_devices(tensors):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append((device, event))
    return tuple(events)


def wait_ready(events: Iterable[Any], timeout: float = 60.0) -> None:
    """Blocks the calling thread until every event of :func:`cuda_ready` has completed.

    Raises:
        TimeoutError: the work queued before an event has not finished within ``timeout`` seconds (a kernel that
            never ends): the caller's thread does not hang with it.

    Examples:
        >>> wait_ready(())
    """
    deadline = time.monotonic() + timeout
    for device, event in events:
        pause = 5e-5  # a short wait is the rule (a weight copy, an optimizer step): looked at often, then less
        while not event.query():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the work queued on {device}'s stream before these tensors were handed over did not finish "
                    f"within {timeout} s"
                )
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)


def order_after(ready: Iterable[Any], tensors: Iterable[object]) -> None:
    """Makes the calling thread's current streams wait for the events of :func:`cuda_ready` (no host
    synchronization), and records the CUDA ``tensors`` on them: their memory, allocated on another thread's stream,
    is then never given to another tensor while this thread's work on them is queued.

    Examples:
        >>> order_after((), [torch.ones(2)])
    """
    for device, event in ready:
        torch.cuda.current_stream(device).wait_event(event)
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
            tensor.record_stream(torch.cuda.current_stream(tensor.device))


def synchronize_devices(tensors: Iterable[object]) -> None:
    """Blocks until the work queued on the calling thread's current stream of every CUDA device of ``tensors``
    has completed (say, copies into them that other threads' streams will read next).

    Examples:
        >>> synchronize_devices([torch.ones(2)])
    """
    for device in _cuda_devices(tensors):
        wait_for_stream(torch.cuda.current_stream(device))


def wait_for_stream(stream: Any) -> None:
    """Blocks until the work queued on CUDA ``stream`` so far is done, asleep rather than spinning.

    ``stream.synchronize()`` (and a default event's) busy-waits under CUDA's default scheduling: a core per waiting
    thread, taken from the env workers. An event made with ``blocking=True`` puts the thread to sleep instead.
    """
    event = torch.cuda.Event(blocking=True)
    event.record(stream)
    event.synchronize()


def with_index(device: torch.device | None) -> torch.device | None:
    """``device`` with its index: a bare ``"cuda"`` becomes the CUDA device current now.

    Call it once, where a collector or server is built: each thread has a current device of its own, so a bare
    ``"cuda"`` read later on a thread the collector started could name another GPU than the caller meant.

    Examples:
        >>> with_index(torch.device("cpu"))
        device(type='cpu')
        >>> with_index(None) is None
        True
    """
    if device is not None and device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _cuda_devices(values: Iterable[object]) -> set[torch.device]:
    return {value.device for value in values if isinstance(value, torch.Tensor) and value.is_cuda}


def check_device(name: str, value: DeviceLike) -> torch.device | None:
    """Parses ``value`` into a device that exists on this machine.

    Args:
        name: the argument's name, for the error message.
        value: a device, a device string such as ``"cuda:0"``, an index or ``None``.

    Returns:
        The device, or ``None`` when ``value`` is ``None``.

    Raises:
        ConfigurationError: the device cannot be parsed or does not exist here.

    Examples:
        >>> check_device("device", "cpu")
        device(type='cpu')
        >>> check_device("device", "gpu")
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: device='gpu' is invalid: expected a torch device such as 'cpu' or 'cuda:0'.
    """
    if value is None:
        return None
    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ConfigurationError.bad_value(name, value, "a torch device such as 'cpu' or 'cuda:0'") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError.bad_value(name, value, "an existing device (CUDA is not available here)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigurationError.bad_value(name, value, f"a CUDA index below {count} (devices found: {count})")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigurationError.bad_value(name, value, "an existing device (MPS is not available here)")
    elif dev.type not in ("cpu", "meta"):
        module = getattr(torch, dev.type, None)
        is_available = getattr(module, "is_available", None)
        if is_available is None or not is_available():
            raise ConfigurationError.bad_value(name, value, f"an existing device ({dev.type} is not available here)")
    return dev


@dataclass(frozen=True)
class Devices:
    """The resolved devices of one collector (or one worker)."""

    env: torch.device
    policy: torch.device
    storing: torch.device

    @property
    def policy_is_env(self) -> bool:
        """Whether no cast is needed between policy and env."""
        return self.policy == self.env


def module_device(policy: object) -> torch.device | None:
    """Where ``policy``'s parameters (else buffers) are; ``None`` for a module without any, or a non-module.

    Examples:
        >>> module_device(torch.nn.Linear(2, 2))
        device(type='cpu')
    """
    if isinstance(policy, torch.nn.Module):
        for param in policy.parameters():
            return param.device
        for buffer in policy.buffers():
            return buffer.device
    return None


def resolve_devices(
    *,
    device: DeviceLike = None,
    env_device: DeviceLike = None,
    policy_device: DeviceLike = None,
    storing_device: DeviceLike = None,
    env_default: torch.device | None = None,
    policy: object = None,
) -> Devices:
    """Applies the device rules.

    Args:
        device: fills every unset device below.
        env_device: where env data lives (default: ``device``, then ``env_default``, then cpu).
        policy_device: where the policy runs (default: ``device``, then the policy's parameters, then env).
        storing_device: where batches land (default: ``device``, then env).
        env_default: the env's own device, when known.
        policy: the policy, to read its parameters' device.

    Returns:
        The resolved :class:`Devices`.

    Examples:
        >>> resolve_devices(device="cpu")
        Devices(env=device(type='cpu'), policy=device(type='cpu'), storing=device(type='cpu'))
    """
    dev = check_device("device", device)
    env = check_device("env_device", env_device) or dev or env_default or torch.device("cpu")
    pol = check_device("policy_device", policy_device) or dev or module_device(policy) or env
    store = check_device("storing_device", storing_device) or dev or env
    return Devices(env=env, policy=pol, storing=store)
