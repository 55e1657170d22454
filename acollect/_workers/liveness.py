"""The pool's liveness loop: exit codes, heartbeats, start-up deadlines, restarts.

Every ``MONITOR_PERIOD`` seconds each worker is checked: a process that exited, a
worker that did not start in time, a heartbeat gone stale, a batch announced but
never delivered, or a collecting worker making no env step. The worker is then
restarted (within ``max_restarts``) or the pool fails with an error naming it; under
``on_worker_loss="continue"`` a running pool loses the worker instead (it is dropped, the others collect
on) and fails only when the last one is gone.
:class:`Monitor` runs it, given the endpoint, the handles, where failures and
counts go, and how the pool starts a worker in a slot (or frees one for a worker
started by hand).

The loop also sends the collector's own heartbeat, every ``heartbeat_interval``, to
the workers that may have no parent process to watch (started by hand, or by an
engine on another host): without it they would never learn that their collector
died or vanished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio

from acollect._runtime.endpoint import Endpoint
from acollect._runtime.wire import pack_message
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle, WorkerMode, WorkerState
from acollect._workers.pool_events import Counters, PoolEvents, PoolState
from acollect._workers.pool_settings import PoolSettings
from acollect._workers.process import describe_exit
from acollect.errors import TransportError, WorkerCrashedError, WorkerError, WorkerTimeoutError

__all__ = ["MONITOR_PERIOD", "UNREACHABLE_GRACE", "Monitor"]

logger = logging.getLogger("acollect")

#: Seconds between two liveness checks: a dead worker is noticed within about this.
MONITOR_PERIOD = 0.1
#: Seconds a local worker that could not be sent to may take to show an exit code (a process killed a
#: moment ago is reported with its signal); past that it counts as dead all the same, and is restarted.
UNREACHABLE_GRACE = 1.0


class Monitor:
    """The pool's liveness loop (:meth:`run`): finds dead, hung or silent workers; restarts them or fails the pool.

    Args:
        endpoint: the pool's endpoint (the collector's heartbeats go through it).
        handles: the pool's workers, by index.
        events: where a failure goes and every check is told.
        counters: where the batches a dead worker held are counted.
        mode: what every worker is under (paused, running: a running worker's batch in progress dies with it).
        settings: the pool's settings (:class:`~acollect._workers.pool_settings.PoolSettings`): its deadlines
            (``heartbeat_timeout``, ``startup_timeout``), ``max_restarts``, whether workers hold credits (then late
            batches are counted as they come) and the launcher, whose workers on this host each watch their parent
            process (no heartbeat is sent them).
        spawn: starts a new process in a worker's slot (after its previous one is gone).
        vacate: frees a slot of a worker started by hand, for the next one that joins.
        lost: called after a worker was lost (``on_worker_loss="continue"``).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        handles: Sequence[WorkerHandle],
        events: PoolEvents,
        counters: Counters,
        mode: WorkerMode,
        settings: PoolSettings,
        *,
        spawn: Callable[[WorkerHandle], Awaitable[None]],
        vacate: Callable[[WorkerHandle], None],
        lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.endpoint = endpoint
        self.handles = handles
        self.events = events
        self.counters = counters
        self.mode = mode
        self.settings = settings
        self._spawn = spawn
        self._vacate = vacate
        self._lost = lost
        self.stopped = anyio.Event()  # set once run() ended, however
        # A local process's exit code shows within milliseconds of its death; an engine (Ray, submitit) learns
        # of one later, and says why (a job's state): it gets up to heartbeat_timeout to tell.
        timeout = settings.heartbeat_timeout
        self.unreachable_grace = UNREACHABLE_GRACE if settings.launcher.same_host else max(UNREACHABLE_GRACE, timeout)

    async def run(self) -> None:
        """Checks every worker each ``MONITOR_PERIOD`` until cancelled."""
        try:
            await self._loop()
        finally:
            self.stopped.set()

    async def _loop(self) -> None:
        beat = pack_message(P.HEARTBEAT)
        interval = min((h.config.heartbeat_interval for h in self.handles), default=1.0)
        next_beat = 0.0
        heartbeat_timeout, startup_timeout = self.settings.heartbeat_timeout, self.settings.startup_timeout
        while True:
            await anyio.sleep(MONITOR_PERIOD)
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + interval
                await self._send_heartbeats(beat)
            for handle in self.handles:
                remote = handle.config.remote  # started by hand: no process handle, liveness from heartbeats only
                if (handle.process is None and not remote) or handle.stopping or handle.lost:
                    continue
                if handle.state is WorkerState.NEW:
                    continue  # neither launched nor waiting for a hand-started worker yet: no start to time out
                if self.events.failure is not None:
                    continue
                code = handle.process.exitcode if handle.process is not None else None
                beats, batches = handle.heartbeats, handle.batches
                if code is not None:
                    await self._on_death(
                        handle,
                        WorkerCrashedError(
                            f"worker {handle.index} ({handle.where}) died: {describe_exit(code)}",
                            worker_id=handle.index,
                            exitcode=code,
                        ),
                    )
                elif handle.unreachable_since is not None and now - handle.unreachable_since > self.unreachable_grace:
                    await self._on_death(
                        handle,
                        WorkerCrashedError(
                            f"worker {handle.index} ({handle.where}) cannot be reached: its connection to the "
                            f"collector is gone (a message to it failed {now - handle.unreachable_since:.1f}s ago)",
                            worker_id=handle.index,
                        ),
                    )
                elif not handle.ready and handle.unreachable_since is None:
                    if now - handle.started_at > startup_timeout:
                        await self._on_death(
                            handle,
                            WorkerTimeoutError(
                                (
                                    f"no remote worker joined as worker {handle.index}"
                                    if remote and not handle.joined
                                    else f"worker {handle.index} ({handle.where}) did not start"
                                )
                                + f" within startup_timeout={startup_timeout}s",
                                worker_id=handle.index,
                            ),
                        )
                elif batches.missing_since is not None and now - batches.missing_since > heartbeat_timeout:
                    await self._on_death(
                        handle,
                        WorkerTimeoutError(
                            f"worker {handle.index} ({handle.where}) sent batch {batches.next_seq} more than "
                            f"heartbeat_timeout={heartbeat_timeout}s ago and it never arrived: its connection "
                            "to the collector dropped it",
                            worker_id=handle.index,
                        ),
                    )
                elif now - beats.last_beat > heartbeat_timeout:
                    await self._on_death(
                        handle,
                        WorkerTimeoutError(
                            f"worker {handle.index} ({handle.where}) sent no heartbeat for "
                            f"{now - beats.last_beat:.1f}s (heartbeat_timeout={heartbeat_timeout}s)",
                            worker_id=handle.index,
                        ),
                    )
                elif beats.busy and now - beats.last_progress > heartbeat_timeout:
                    await self._on_death(
                        handle,
                        WorkerTimeoutError(
                            f"worker {handle.index} ({handle.where}) is hung: no env step for "
                            f"{now - beats.last_progress:.1f}s while collecting "
                            f"(heartbeat_timeout={heartbeat_timeout}s)",
                            worker_id=handle.index,
                        ),
                    )
            self.events.notify()

    async def _send_heartbeats(self, beat: list[bytes]) -> None:
        """Tells each worker that may have no parent to watch that its collector lives (see acollect._workers.main)."""
        endpoint = self.endpoint
        if endpoint.closed:
            return
        same_host = self.settings.launcher.same_host
        for handle in self.handles:
            if handle.ready and not handle.stopping and (handle.config.remote or not same_host):
                try:
                    # Queued at once or skipped (timeout 0): this loop must never wait on one worker.
                    await endpoint.send(handle.identity, beat, timeout=0)
                except (TransportError, TimeoutError):
                    pass  # gone, or its queue is full: its own heartbeats (or exit code) tell this loop

    async def _on_death(self, handle: WorkerHandle, error: WorkerError) -> None:
        process = handle.process
        max_restarts = self.settings.max_restarts
        if handle.restarts >= max_restarts or self.events.closed:
            if process is not None:
                process.kill()
            if self._loses(handle):
                self._lose(handle, error)
                return
            handle.on_dead()
            self.events.fail(error)
            return
        lost = handle.on_death(lockstep=self.settings.lockstep, running=self.mode.running)
        self.counters.dropped_batches += lost
        if process is None:  # a remote worker: nothing to kill or restart here, its slot waits for a new one
            logger.warning(
                "%s; waiting for a worker to join in its place (%d/%d)", error, handle.restarts, max_restarts
            )
            self._vacate(handle)
            return
        logger.warning("%s; restarting it (%d/%d)", error, handle.restarts, max_restarts)
        process.kill()
        with anyio.move_on_after(2.0):
            while process.exitcode is None:  # noqa: ASYNC110 - an exit code has no event to wait on
                await anyio.sleep(0.01)
        process.close()
        await self._spawn(handle)

    def _loses(self, handle: WorkerHandle) -> bool:
        """Whether a worker gone with its restarts spent is dropped rather than failing the pool: elastic, a pool that
        runs (a worker that never started fails the start as ever), and another worker left to collect on."""
        return (
            self.settings.elastic
            and self.events.state is PoolState.RUNNING
            and any(h is not handle and not h.lost for h in self.handles)
        )

    def _lose(self, handle: WorkerHandle, error: WorkerError) -> None:
        """Drops ``handle`` for good: what it held is counted, whoever waits on it wakes, the loss is told once."""
        self.counters.dropped_batches += handle.on_lost(lockstep=self.settings.lockstep, running=self.mode.running)
        self.counters.lost_workers += 1
        left = sum(not h.lost for h in self.handles)
        logger.warning(
            "%s; its restarts are spent (max_worker_restarts=%d): worker %d is lost, collection goes on with the %d "
            "workers left (on_worker_loss='continue')",
            error,
            self.settings.max_restarts,
            handle.index,
            left,
        )
        self._lost()
        self.events.notify()
