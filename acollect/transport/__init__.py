"""Moving messages and tensors between a collector and its worker processes.

Three layers, none of which knows about envs:

* :mod:`~acollect._runtime.wire`: the versioned wire format (msgpack header and
  raw tensor frames; flat weight buffers). Never pickle. The tensor layout it carries,
  and its validation, is :mod:`~acollect._runtime.layout`.
* :mod:`~acollect._batches.shm`: shared-memory slots for large same-host payloads;
  :mod:`~acollect._batches.slot_ring` groups one worker's slots into a ring of credits.
* :mod:`~acollect._runtime.endpoint`: ZeroMQ sockets, anyio (asyncio or trio) on the collector's
  side and blocking in workers; :mod:`~acollect._runtime.server_socket`: the blocking ROUTER of a
  server thread (the inference server's). This package is acollect's one ZeroMQ boundary: nothing
  outside it imports ``zmq``, and ZeroMQ's errors become :class:`~acollect.errors.TransportError` here.
"""

from acollect._batches.shm import ShmSegment as ShmSegment
from acollect._batches.shm import ShmTensorDictSlot as ShmTensorDictSlot
from acollect._batches.shm import cleanup_stale as cleanup_stale
from acollect._batches.shm import shm_available as shm_available
from acollect._batches.slot_ring import ShmSlotRing as ShmSlotRing
from acollect._runtime.endpoint import Endpoint as Endpoint
from acollect._runtime.server_socket import ServerSocket as ServerSocket
from acollect._runtime.wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from acollect._runtime.wire import decode_tensordict as decode_tensordict
from acollect._runtime.wire import encode_tensordict as encode_tensordict
from acollect._runtime.wire import pack_message as pack_message
from acollect._runtime.wire import unpack_message as unpack_message
from acollect._runtime.worker_socket import WorkerSocket as WorkerSocket
from acollect._weights.sync import flatten_params as flatten_params
from acollect._weights.sync import unflatten_into as unflatten_into

__all__ = [
    "PROTOCOL_VERSION",
    "Endpoint",
    "ServerSocket",
    "ShmSegment",
    "ShmSlotRing",
    "ShmTensorDictSlot",
    "WorkerSocket",
    "cleanup_stale",
    "decode_tensordict",
    "encode_tensordict",
    "flatten_params",
    "pack_message",
    "shm_available",
    "unflatten_into",
    "unpack_message",
]
