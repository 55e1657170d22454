"""The trainer's own calls to an inference server: each handed to the host of the server's loop, and its answer
awaited.

An :meth:`~acollect.inference.InferenceServer.infer` call becomes an
:class:`~acollect.inference._batching.InferenceRequest` (its observations on the host: the passes gather every
request in host memory), and a weight update a
:class:`~acollect.inference._loop.Ticket`; the host (:class:`~acollect.inference._loop_thread.LoopThread` or
:class:`~acollect.inference._loop_process.LoopProcess`) answers each through :meth:`LocalCalls.answered`, on the
event loop, and the server wakes every waiter when it fails or closes (:meth:`LocalCalls.wake_all`), whose call
then raises rather than waiting for ever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import torch
from tensordict import TensorDictBase

from acollect._devices import cuda_ready, move_to, wait_ready
from acollect.errors import CollectorStateError, ConfigurationError
from acollect.inference._batching import InferenceRequest
from acollect.inference._codec import leaves_of
from acollect.inference._loop import Ticket
from acollect.inference._loop_process import LoopProcess
from acollect.inference._loop_thread import LoopThread

__all__ = ["LocalCalls"]


class LocalCalls:
    """The calls of this process waiting for the server's answer, one event each; one weight update at a time."""

    __slots__ = ("_events", "_weights_lock")

    def __init__(self) -> None:
        self._events: dict[InferenceRequest | Ticket, anyio.Event] = {}  # the tasks waiting for an answer
        self._weights_lock = anyio.Lock()  # one at a time: versions in call order, one segment

    def answered(self, item: InferenceRequest | Ticket) -> None:
        """The host answered ``item`` (on the event loop): its caller goes on."""
        event = self._events.get(item)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        """Wakes every waiting caller (the server failed or closed: their calls raise)."""
        for event in self._events.values():
            event.set()

    async def infer(
        self, host: LoopThread | LoopProcess, td: TensorDictBase, check_running: Callable[[str], None]
    ) -> TensorDictBase:
        """``td`` through the server's policy (see :meth:`~acollect.inference.InferenceServer.infer`);
        ``check_running`` raises the server's failure, or that it is not running."""
        if not isinstance(td, TensorDictBase):
            raise ConfigurationError.bad_value("td", td, "a TensorDict of observations")
        single = td.batch_dims == 0
        batched = td.unsqueeze(0) if single else td
        leaves = leaves_of(batched)
        devices = {value.device for value in leaves.values() if not value.is_cpu}
        if devices:
            # The passes gather requests in host memory (one transfer per pass for all of them): observations on a
            # GPU come to the host first, waited for off the event loop, and the outputs go back to their device.
            leaves = await _to_host(leaves)
        request = InferenceRequest(leaves, int(batched.batch_size[0]))
        event = self._events[request] = anyio.Event()
        host.submit(request)
        try:
            await event.wait()
        except BaseException:
            request.abandoned = True
            raise
        finally:
            del self._events[request]
        if request.error is not None:
            raise request.error
        if request.outputs is None:
            check_running("infer()")
            raise CollectorStateError("infer(): the inference server closed before answering")
        home = next(iter(devices)) if len(devices) == 1 else None
        for key, value in request.outputs.items():
            value = value.squeeze(0) if single else value
            td.set(key, move_to(value, home) if home is not None else value)
        return td

    async def update_weights(
        self, host: LoopThread | LoopProcess, checked: TensorDictBase, check_running: Callable[[str], None]
    ) -> int:
        """Copies ``checked`` (weights that fit the server's policy) in between two passes; returns the new version."""
        async with self._weights_lock:
            check_running("update_policy_weights_()")
            ticket = Ticket(checked, cuda_ready(checked.values(include_nested=True, leaves_only=True)))
            event = self._events[ticket] = anyio.Event()
            try:
                await host.submit_weights(ticket)
                await event.wait()
            except BaseException:
                ticket.abandoned = True
                raise
            finally:
                del self._events[ticket]
        if ticket.error is not None:
            raise ticket.error
        if not ticket.version:
            check_running("update_policy_weights_()")
            raise CollectorStateError("update_policy_weights_(): the inference server closed before applying them")
        return ticket.version


async def _to_host(leaves: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
    """``leaves`` on the CPU, copied in a thread once the work the caller queued on their streams is done."""
    ready = cuda_ready(leaves.values())  # the caller's streams: where these tensors were made

    def copy() -> dict[Any, torch.Tensor]:
        wait_ready(ready)
        return {key: value.to("cpu") for key, value in leaves.items()}  # waited for: the host reads them next

    return await anyio.to_thread.run_sync(copy)
