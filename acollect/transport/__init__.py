"""Moving messages and tensors between a collector and its worker processes: the public names.

The code lives with the flow it serves; this package re-exports what code outside acollect may use.
None of it knows about envs:

* the wire format (:mod:`acollect._runtime.wire`: a msgpack header and raw tensor frames, never pickle) and the
  ZeroMQ sockets (:mod:`acollect._runtime.endpoint`, :mod:`acollect._runtime.worker_socket`,
  :mod:`acollect._runtime.server_socket`) are the process boundary, in :mod:`acollect._runtime`, acollect's one
  ZeroMQ boundary: nothing outside it imports ``zmq``, and ZeroMQ's errors become
  :class:`~acollect.errors.TransportError` there; CURVE keys are :mod:`acollect.transport.auth`;
* shared-memory slots (:mod:`acollect._batches.shm`) and one worker's ring of them
  (:mod:`acollect._batches.slot_ring`) are a batch's memory, in :mod:`acollect._batches`;
* flat weight buffers (:func:`flatten_params`, :func:`unflatten_into`) are how a weight push travels, in
  :mod:`acollect._weights.sync`.
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
