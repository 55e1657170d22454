"""The pool's liveness loop: exit codes, heartbeats, start-up deadlines, restarts.

Every ``MONITOR_PERIOD`` seconds each worker is checked: a process that exited, a
worker that did not start in time, a heartbeat gone stale, a batch announced but
never delivered, or a collecting worker making no env step. The worker is then
restarted (within ``max_restarts``) or the pool fails with an error naming it.
"""

from __future__ import annotations

import logging
import time

import anyio

from acollect.errors import WorkerCrashedError, WorkerError, WorkerTimeoutError
from acollect.pool.base import PoolBase
from acollect.pool.handles import WorkerHandle
from acollect.worker.process import describe_exit

__all__ = ["MONITOR_PERIOD", "LivenessMixin"]

logger = logging.getLogger("acollect")

#: Seconds between two liveness checks: a dead worker is noticed within about this.
MONITOR_PERIOD = 0.1


class LivenessMixin(PoolBase):
    """The watching side of :class:`~acollect.pool.pool.WorkerPool` (mixed into it)."""

    # -- liveness ------------------------------------------------------------------------
    async def _monitor_loop(self) -> None:
        while True:
            await anyio.sleep(MONITOR_PERIOD)
            now = time.monotonic()
            for handle in self.handles:
                remote = handle.config.remote  # started by hand: no process handle, liveness from heartbeats only
                if (handle.process is None and not remote) or handle.stopping or self.failure is not None:
                    continue
                code = handle.process.exitcode if handle.process is not None else None
                if code is not None:
                    await self._on_death(handle, WorkerCrashedError(
                        f"worker {handle.index} ({handle.where}) died: {describe_exit(code)}",
                        worker_id=handle.index,
                        exitcode=code,
                    ))  # fmt: skip
                elif not handle.ready:
                    if now - handle.started_at > self.startup_timeout:
                        await self._on_death(handle, WorkerTimeoutError(
                            (f"no remote worker joined as worker {handle.index}" if remote and not handle.joined
                             else f"worker {handle.index} ({handle.where}) did not start")
                            + f" within startup_timeout={self.startup_timeout}s",
                            worker_id=handle.index,
                        ))  # fmt: skip
                elif handle.missing_since is not None and now - handle.missing_since > self.heartbeat_timeout:
                    await self._on_death(handle, WorkerTimeoutError(
                        f"worker {handle.index} ({handle.where}) sent batch {handle.next_seq} more than "
                        f"heartbeat_timeout={self.heartbeat_timeout}s ago and it never arrived: its connection "
                        "to the collector dropped it",
                        worker_id=handle.index,
                    ))  # fmt: skip
                elif now - handle.last_beat > self.heartbeat_timeout:
                    await self._on_death(handle, WorkerTimeoutError(
                        f"worker {handle.index} ({handle.where}) sent no heartbeat for {now - handle.last_beat:.1f}s "
                        f"(heartbeat_timeout={self.heartbeat_timeout}s)",
                        worker_id=handle.index,
                    ))  # fmt: skip
                elif handle.busy and now - handle.last_progress > self.heartbeat_timeout:
                    await self._on_death(handle, WorkerTimeoutError(
                        f"worker {handle.index} ({handle.where}) is hung: no env step for "
                        f"{now - handle.last_progress:.1f}s while collecting "
                        f"(heartbeat_timeout={self.heartbeat_timeout}s)",
                        worker_id=handle.index,
                    ))  # fmt: skip
            self._notify()

    async def _on_death(self, handle: WorkerHandle, error: WorkerError) -> None:
        process = handle.process
        if process is None:  # a remote worker: nothing to kill or restart here, its slot waits for a new one
            if handle.restarts >= self.max_restarts or self._closed:
                self._fail(error)
                return
            handle.restarts += 1
            logger.warning("%s; waiting for a worker to join in its place (%d/%d)", error, handle.restarts,
                           self.max_restarts)  # fmt: skip
            if handle.outstanding or (self.running and handle.busy):
                self.dropped_batches += 1
            self._vacate(handle)
            return
        if handle.restarts >= self.max_restarts or self._closed:
            process.kill()
            self._fail(error)
            return
        handle.restarts += 1
        logger.warning("%s; restarting it (%d/%d)", error, handle.restarts, self.max_restarts)
        process.kill()
        with anyio.move_on_after(2.0):
            while process.exitcode is None:  # noqa: ASYNC110 - an exit code has no event to wait on
                await anyio.sleep(0.01)
        process.close()
        if handle.outstanding or (self.running and handle.busy):
            self.dropped_batches += 1
        await self._spawn(handle)
