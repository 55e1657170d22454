"""What every long-lived object of acollect runs on: tasks, threads, event loops, state machines.

Internal:

* :mod:`~acollect._runtime.machine`: ``StateTable``, the states and moves of a stateful object, each move with its
  reason (rendered into docs/concepts.md);
* :mod:`~acollect._runtime.lifecycle`: the state machine of collectors and the inference server;
* :mod:`~acollect._runtime.tasks`: ``TaskOwner``, the one task group of a collector;
* :mod:`~acollect._runtime.threads`: ``run_in_thread``, blocking work off the event loop, cancellable and bounded;
* :mod:`~acollect._runtime.loops`: the event loop a collector belongs to, and what happens when it ends;
* :mod:`~acollect._runtime.notify`: ``Notifier``, a change said to every task waiting for one.
"""
