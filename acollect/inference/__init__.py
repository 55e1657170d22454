"""Central inference: env workers step, one server runs the policy on all their observations at once.

* :class:`InferenceServer`: batches requests (from worker processes over ZeroMQ, or from async code in
  this process with :meth:`InferenceServer.infer`) into one forward pass in a thread of its own;
* :class:`~acollect.inference.client.RemotePolicy`: the workers' side;
* :class:`InferenceStats`: passes, batch sizes, latency.

:class:`~acollect.AsyncBatchedCollector` puts them together.
"""

from acollect.inference._batching import InferenceStats
from acollect.inference._server import InferenceServer

__all__ = ["InferenceServer", "InferenceStats"]
