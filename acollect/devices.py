"""Device resolution for collectors, with TorchRL's rules.

``device`` fills whichever of ``env_device``, ``policy_device`` and
``storing_device`` are unset; an unset ``policy_device`` follows the policy's
own parameters, then the env; an unset ``storing_device`` follows the env.
Every device is checked to exist before anything is built, so a typo or a
missing GPU fails at construction with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
from tensordict import TensorDictBase

from acollect.errors import ConfigurationError

__all__ = ["DeviceLike", "Devices", "check_device", "move_to", "resolve_devices"]

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


def _module_device(policy: object) -> torch.device | None:
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
    pol = check_device("policy_device", policy_device) or dev or _module_device(policy) or env
    store = check_device("storing_device", storing_device) or dev or env
    return Devices(env=env, policy=pol, storing=store)
