"""Worker processes: the process main loop, how local processes start, and the control protocol.

A worker runs the same :class:`~acollect.rollout.RolloutEngine` as the in-process collector,
driven over ZeroMQ by a collector's :class:`~acollect.transport.endpoint.Endpoint`.
"""
