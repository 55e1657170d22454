"""Moving messages and tensors between a collector and its worker processes.

Three layers, none of which knows about envs:

* :mod:`~acollect.transport._wire`: the versioned wire format (msgpack header and
  raw tensor frames; flat weight buffers). Never pickle. The tensor layout it carries,
  and its validation, is :mod:`~acollect.transport._layout`.
* :mod:`~acollect.transport._shm`: shared-memory slots for large same-host payloads;
  :mod:`~acollect.transport._shm_ring` groups one worker's slots into a ring of credits.
* :mod:`~acollect.transport._endpoint`: ZeroMQ sockets, anyio (asyncio or trio) on the collector's
  side and blocking in workers; :mod:`~acollect.transport._server_socket`: the blocking ROUTER of a
  server thread (the inference server's). This package is acollect's one ZeroMQ boundary: nothing
  outside it imports ``zmq``, and ZeroMQ's errors become :class:`~acollect.errors.TransportError` here.
"""

from acollect.transport._endpoint import Endpoint as Endpoint
from acollect.transport._server_socket import ServerSocket as ServerSocket
from acollect.transport._shm import ShmSegment as ShmSegment
from acollect.transport._shm import ShmTensorDictSlot as ShmTensorDictSlot
from acollect.transport._shm import cleanup_stale as cleanup_stale
from acollect.transport._shm import shm_available as shm_available
from acollect.transport._shm_ring import ShmSlotRing as ShmSlotRing
from acollect.transport._weight_sync import flatten_params as flatten_params
from acollect.transport._weight_sync import unflatten_into as unflatten_into
from acollect.transport._wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from acollect.transport._wire import decode_tensordict as decode_tensordict
from acollect.transport._wire import encode_tensordict as encode_tensordict
from acollect.transport._wire import pack_message as pack_message
from acollect.transport._wire import unpack_message as unpack_message
from acollect.transport._worker_socket import WorkerSocket as WorkerSocket

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
