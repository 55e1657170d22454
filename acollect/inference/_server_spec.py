"""What an inference server is made of, wherever it runs: its spec, its policy copy, its sockets, its loop.

:class:`ServerSpec` is everything a server needs to start, picklable (cloudpickle, like a worker's config), so
that the same spec builds the server's loop (:func:`make_loop`) in a thread of the trainer or in a process of its
own (:mod:`acollect.inference._process_main`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.nn import InteractionType

from acollect._batches.shm import shm_available
from acollect._devices import module_device, wait_for_stream
from acollect._runtime.auth import ServerKeys
from acollect._runtime.server_socket import ServerSocket
from acollect.inference._batching import Batcher, Forward, ServerStatsRecorder
from acollect.inference._loop import Mail, ServerLoop
from acollect.inference._slot_hub import SlotHub

__all__ = ["ServerSpec", "bind", "build_policy", "device_of", "make_loop"]


@dataclass
class ServerSpec:
    """An inference server's settings (checked by :class:`~acollect.inference.InferenceServer`)."""

    policy: Any
    policy_factory: Callable[[], Any] | None
    max_batch_size: int
    max_wait: float
    device: torch.device | None
    exploration: InteractionType | None
    address: str | None
    keys: ServerKeys | None
    slots: bool
    #: torch threads of a server process (a server thread shares the trainer's)
    num_threads: int = 1
    #: forward passes that may run at once (see acollect.inference._passes)
    passes_in_flight: int = 2
    #: a private directory (mode 0700) for the slot listener (``None``: a fresh one); a server process's trainer
    #: makes it, and removes it whatever becomes of the process
    slot_dir: str | None = None


def build_policy(spec: ServerSpec) -> Any:
    """The server's inference copy of the policy, on ``spec.device``, in eval mode."""
    module = spec.policy_factory() if spec.policy_factory is not None else copy.deepcopy(spec.policy)
    if isinstance(module, torch.nn.Module):
        if spec.device is not None:
            module = module.to(spec.device)
        module.eval()
        device = module_device(module)
        if device is not None and device.type == "cuda":
            # Copied on this thread's stream; the passes run on streams of their own that nothing orders after it.
            wait_for_stream(torch.cuda.current_stream(device))
    return module


def device_of(module: Any, device: torch.device | None) -> torch.device:
    """Where the forward pass runs: ``device``, else where the module's tensors are, else the CPU."""
    if device is not None:
        return device
    return module_device(module) or torch.device("cpu")


def bind(spec: ServerSpec) -> tuple[ServerSocket, SlotHub | None]:
    """Binds the socket worker processes send to, and the same-host workers' slot listener where it applies."""
    assert spec.address is not None
    # Many workers each keep one request in flight: the queue bound is generous, the heartbeats a
    # worker's own (a worker that vanished is noticed alike from either side).
    sock = ServerSocket(spec.address, hwm=1024, heartbeat_ivl=1.0, heartbeat_timeout=10.0, keys=spec.keys)
    hub = None
    if spec.slots and spec.keys is None and spec.address.startswith("ipc") and shm_available():
        try:
            hub = SlotHub(directory=spec.slot_dir)
        except BaseException:
            sock.close()
            raise
    return sock, hub


def make_loop(
    spec: ServerSpec, module: Any, mail: Mail, recorder: ServerStatsRecorder, close_socket: Callable[[], None]
) -> ServerLoop:
    """The server's loop around ``module`` (made by :func:`build_policy`): its forward pass, its batcher, and the
    sockets :func:`bind` binds where ``spec.address`` says (``loop.sock`` and ``loop.hub``; ``close_socket`` closes
    them)."""
    forward = Forward(module, device_of(module, spec.device), spec.exploration)
    sock, hub = bind(spec) if spec.address is not None else (None, None)
    return ServerLoop(
        mail,
        Batcher(spec.max_batch_size, spec.max_wait),
        forward,
        recorder,
        sock,
        close_socket,
        hub,
        in_flight=spec.passes_in_flight,
        torch_threads=spec.num_threads,
    )
