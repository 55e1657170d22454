"""A batch's memory, from the plan of its size to the credits that give it back.

Internal. Where the frames of a batch live and how they go from the envs to the caller:

* :mod:`~acollect._batches.plan`: ``BatchPlan``, how many steps each env takes per batch (settled once);
* :mod:`~acollect._batches.shm`: shared-memory segments and slots, and the cleanup of stale ones;
* :mod:`~acollect._batches.slot_ring`: one worker's slots for one layout, and the pipe its collector gives them back
  by (a credit, a slot back: one word a batch);
* :mod:`~acollect._batches.shared_batches`: lockstep batches written in place, each worker its own rows;
* :mod:`~acollect._batches.lending`: shared memory lent to the caller and given back when dropped;
* :mod:`~acollect._batches.handout_buffers`: memory for the batches a collector copies out;
* :mod:`~acollect._batches.cuda_dma`: batches to a CUDA device by DMA;
* :mod:`~acollect._batches.counts`: frames and batches counted as they go;
* :mod:`~acollect._batches.trajectories` and :mod:`~acollect._batches.trajectory_batches`: batches split into
  trajectories, and batches of whole episodes.
"""
