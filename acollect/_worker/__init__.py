"""Worker processes: the process main loop, how local processes start, and the control protocol.

A worker runs an engine built by the same builder as the in-process collector's
(:func:`acollect._rollout.build.build_engine`), driven over ZeroMQ by a collector's
:class:`~acollect.transport._endpoint.Endpoint`.
"""
