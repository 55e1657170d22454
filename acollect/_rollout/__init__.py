"""The rollout engines: an env and a policy turned into ``[n_envs, T]`` batches, one way per way of stepping envs.

Internal: the collectors and the workers build them through :func:`acollect._rollout.build.build_engine`.

* :mod:`~acollect._rollout.engine`: what collectors and workers use of an engine (``Engine``, ``BlockingEngine``);
* :mod:`~acollect._rollout.blocking`: ``RolloutEngine``, a batched env stepped by blocking code (the in-process
  collector's thread, most workers), with the helpers :mod:`~acollect._rollout.time_slices` (per-step copies
  into the batch) and :mod:`~acollect._rollout.env_faults` (``env_errors="restart"``);
* :mod:`~acollect._rollout.groups`: ``EngineGroups``, a worker's envs in groups that step while the others wait
  for an inference server;
* :mod:`~acollect._rollout.coroutines`: ``AsyncRollout``, coroutine envs stepped as tasks on an event loop, with
  :mod:`~acollect._rollout.env_steps`, :mod:`~acollect._rollout.env_turns`, :mod:`~acollect._rollout.policy_passes`
  and :mod:`~acollect._rollout.row_ring`;
* :mod:`~acollect._rollout.own_loop`: ``LoopRollout``, an ``AsyncRollout`` on an event loop of its own behind a
  blocking surface (a worker's coroutine envs);
* :mod:`~acollect._rollout.build`: the one builder of all of them, which asks
  :mod:`~acollect._batches.plan` (``BatchPlan``, the batch-size plan the collectors keep too) how many steps
  each env takes per batch.
"""
