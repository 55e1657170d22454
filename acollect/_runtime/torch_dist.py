"""Batch tensors and weights over torch.distributed (gloo on CPU, NCCL GPU to GPU, MPI).

Control never goes through here: commands, heartbeats and batch headers stay on
ZeroMQ, so nothing busy-polls a TCPStore. What this module moves is the bulk:

* each batch's leaves, worker -> collector, with point-to-point sends on the
  default process group (the header on ZeroMQ says a batch follows);
* each weight push's flat buffers, collector -> every worker, with a broadcast
  on a second group, so a push never queues behind a batch in flight.

The collector is rank 0; worker ``i`` is rank ``i + 1``. Every wait has a deadline
in seconds; the process group's own timeout is set to the same number of
seconds, not torch's default of 30 minutes.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from acollect.errors import ConfigurationError, TransportError

__all__ = ["BACKENDS", "DistLink", "check_backend", "init_groups", "wait_all"]

#: The backends ``backend=`` accepts.
BACKENDS = ("gloo", "nccl", "mpi")


def check_backend(backend: object) -> str:
    """Validates ``backend`` against what this torch build offers.

    Raises:
        ConfigurationError: unknown, or not built into torch here.
    """
    if backend not in BACKENDS:
        raise ConfigurationError.bad_value("backend", backend, f"one of {BACKENDS}")
    available = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}
    if not dist.is_available() or not available[str(backend)]():
        raise ConfigurationError.bad_value("backend", backend, "a backend built into this torch (see `acollect info`)")
    return str(backend)


def init_groups(backend: str, init_method: str, rank: int, world_size: int, timeout: float) -> dist.ProcessGroup | None:
    """Joins the default group and creates the weights group (every rank calls this, in this order).

    Returns:
        The weights group.

    Raises:
        TransportError: the rendezvous failed or timed out.
    """
    delta = datetime.timedelta(seconds=timeout)
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=delta)
        return dist.new_group(backend=backend, timeout=delta)
    except (RuntimeError, ValueError) as exc:  # torch's DistBackendError and store timeouts are RuntimeErrors
        raise TransportError(f"torch.distributed rendezvous at {init_method} (rank {rank}) failed: {exc}") from exc


def wait_all(works: Sequence[Any], *, stop: threading.Event | None, timeout: float, what: str) -> None:
    """Waits until every ``work`` completed, within one deadline; ``stop`` is checked between works.

    gloo's point-to-point works only complete inside ``wait()`` (polling ``is_completed()`` would
    spin forever), so each is waited on with what is left of the deadline.

    Raises:
        TimeoutError: not done within ``timeout`` seconds.
        TransportError: an operation failed, or ``stop`` was set.
    """
    deadline = time.monotonic() + timeout
    for work in works:
        if stop is not None and stop.is_set():
            raise TransportError(f"{what} abandoned: the caller was cancelled")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{what} did not complete within {timeout}s")
        try:
            work.wait(timeout=datetime.timedelta(seconds=remaining))
        except RuntimeError as exc:  # torch raises timeouts and peer failures alike as RuntimeErrors
            if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                raise TimeoutError(f"{what} did not complete within {timeout}s: {exc}") from exc
            raise TransportError(f"{what} failed: {exc}") from exc


class DistLink:
    """A worker's side: joins the groups, sends batch leaves to rank 0, receives weight broadcasts.

    Args:
        fields: the ``dist_init`` message: ``backend``, ``init_method``, ``rank``, ``world_size``,
            ``timeout``.
    """

    def __init__(self, fields: dict[str, Any]) -> None:
        self.backend = str(fields["backend"])
        self.rank = int(fields["rank"])
        self.timeout = float(fields["timeout"])
        if self.backend == "nccl":
            # One GPU per rank: NCCL refuses two ranks on one device.
            self.device = torch.device("cuda", self.rank % max(1, torch.cuda.device_count()))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.weights_group = init_groups(
            self.backend, str(fields["init_method"]), self.rank, int(fields["world_size"]), self.timeout
        )

    def send_batch(self, leaves: Sequence[torch.Tensor]) -> None:
        """Sends each leaf to rank 0 (in layout order) and waits until all are taken."""
        tensors = [t.to(self.device).contiguous() for t in leaves]
        works = [dist.isend(t, dst=0, tag=i) for i, t in enumerate(tensors)]
        wait_all(works, stop=None, timeout=self.timeout, what=f"sending a batch from rank {self.rank}")

    def recv_weights(self, nbytes: Sequence[int]) -> list[torch.Tensor]:
        """Receives one broadcast flat ``uint8`` buffer per model."""
        flats = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in nbytes]
        works = [dist.broadcast(f, src=0, group=self.weights_group, async_op=True) for f in flats]
        wait_all(works, stop=None, timeout=self.timeout, what=f"receiving weights on rank {self.rank}")
        return flats
