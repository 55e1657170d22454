"""What every long-lived object of acollect runs on: tasks, threads, event loops, state machines, the process boundary.

Internal:

* :mod:`~acollect._runtime.machine`: ``StateTable``, the states and moves of a stateful object, each move with its
  reason (rendered into docs/concepts.md);
* :mod:`~acollect._runtime.lifecycle`: the state machine of collectors and the inference server;
* :mod:`~acollect._runtime.tasks`: ``TaskOwner``, the one task group of a collector;
* :mod:`~acollect._runtime.threads`: ``run_in_thread``, blocking work off the event loop, cancellable and bounded;
* :mod:`~acollect._runtime.loops`: the event loop a collector belongs to, and what happens when it ends;
* :mod:`~acollect._runtime.notify`: ``Notifier``, a change said to every task waiting for one;
* :mod:`~acollect._runtime.fd_watch`: a task's wait for a descriptor to turn readable;
* :mod:`~acollect._runtime.spawn`: fresh interpreters handed a pickled config (worker and server processes).

The process boundary, which no flow owns alone (batches, weights, worker commands and inference steps all cross
it):

* :mod:`~acollect._runtime.wire`: the versioned wire format (a msgpack header, raw tensor frames), and the tensor
  layout it carries, :mod:`~acollect._runtime.layout`;
* ZeroMQ, in this package only (its errors become ``TransportError`` here): :mod:`~acollect._runtime.sockets`,
  :mod:`~acollect._runtime.endpoint` (the collector's ROUTER), :mod:`~acollect._runtime.worker_socket`,
  :mod:`~acollect._runtime.server_socket`, and CURVE keys in :mod:`~acollect._runtime.auth` (public as
  :mod:`acollect.transport.auth`);
* :mod:`~acollect._runtime.torch_dist`: batch tensors and weights over torch.distributed.
"""
