"""A worker's life, both ends of the process boundary: started, talked to, watched, fed weights, ended.

Internal. The worker's side:

* :mod:`~acollect._workers.main`: the worker process, one rollout engine driven by commands;
* :mod:`~acollect._workers.protocol`: the control protocol between a collector and its workers;
* :mod:`~acollect._workers.state`, :mod:`~acollect._workers.worker_engine`, :mod:`~acollect._workers.staging`,
  :mod:`~acollect._workers.orphans`: its state machine, its engine, the weights it applies, its cleanup;
* :mod:`~acollect._workers.remote` and :mod:`~acollect._workers.config_codec`: workers started by hand.

How workers start: :mod:`~acollect._workers.launcher` (the interface, public as :mod:`acollect.launchers.base`),
:mod:`~acollect._workers.local_launcher`, :mod:`~acollect._workers.ray_launcher`,
:mod:`~acollect._workers.submitit_launcher`, :mod:`~acollect._workers.launcher_names`, and under the local one
:mod:`~acollect._workers.process` and :mod:`~acollect._workers.forkserver`.

The collector's side: :mod:`~acollect._workers.pool` (``WorkerPool``), one :mod:`~acollect._workers.handles`
state machine per worker, :mod:`~acollect._workers.liveness`, :mod:`~acollect._workers.receive`,
:mod:`~acollect._workers.pool_events`, :mod:`~acollect._workers.pool_settings`,
:mod:`~acollect._workers.weight_push`, and :mod:`~acollect._workers.distributed_pool` over torch.distributed.
"""
