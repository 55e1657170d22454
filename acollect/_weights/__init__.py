"""A weight push: what it may hold, checked against the policy that runs, versioned, and how it travels.

Internal:

* :mod:`~acollect._weights.updates`: ``WeightUpdate`` (one push), ``PolicyWeights`` (staged and applied at a
  batch boundary, versioned), the structure check and its encoding for the ack;
* :mod:`~acollect._weights.sync`: the weight sync schemes (``SharedMemWeightSyncScheme``,
  ``ZmqWeightSyncScheme``): flat buffers, written once and read by every worker, without pickle.

The two ends of a push to worker processes speak the workers' protocol, so they live with the workers:
:mod:`acollect._workers.weight_push` (the collector's side: send, wait for every ack) and
:mod:`acollect._workers.staging` (the worker's side: staged until the engine is free, then applied).
"""
