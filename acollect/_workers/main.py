"""The worker process: one rollout engine, driven by commands from a collector.

Plain synchronous code in two threads, each owning one ZeroMQ socket (sockets
are not thread-safe):

* the **control** thread (the main thread) receives commands, answers them,
  sends heartbeats with the engine's step count, and exits when its collector
  is gone: its parent process died (local workers) or, for a worker with no
  parent to watch (started by hand, or by an engine on another host), the
  collector's own heartbeats stopped;
* the **runner** thread steps the env: it collects a batch whenever one was
  requested (``collect``) or credits are left (``run``), applies staged weights,
  seeds and state at the batch boundary, and sends the batch on its own socket,
  either as raw tensor frames or through a shared-memory slot. Between batches it
  waits on the worker's pipe (:mod:`acollect._batches.slot_ring`): a collector
  on the same host writes each credit (and each slot given back) there directly,
  and the control thread writes a wake-up to it whenever a command changes what the runner may do.

So a worker answers ``stop``, ``pause`` and weight pushes while a batch is in
progress, and a hung env shows as heartbeats whose step count stops moving.

Entry point: :func:`run_worker`, called by the bootstrap of
:mod:`acollect._workers.process` with the worker's
:class:`~acollect._workers.protocol.WorkerConfig`; the engine it drives comes from
:func:`acollect._workers.worker_engine.build_engine`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
import warnings
from collections import deque
from typing import Any

import torch
from tensordict import TensorDictBase

from acollect._affinity import pin_process
from acollect._batches.slot_ring import CREDIT, WAKE, CreditPipe, ShmSlotRing
from acollect._episodes import EpisodeTracker
from acollect._rollout.blocking import RolloutInterrupted
from acollect._rollout.engine import BlockingEngine
from acollect._runtime.wire import PROTOCOL_VERSION, encode_tensordict, pack_message, unpack_message
from acollect._runtime.worker_socket import WorkerSocket
from acollect._time_split import OTHER, TRAINER
from acollect._weights.updates import encode_structure
from acollect._workers import protocol as P
from acollect._workers.orphans import parent_alive, remove_orphans
from acollect._workers.staging import Staging
from acollect._workers.state import LoopState
from acollect._workers.worker_engine import build_engine

__all__ = ["run_worker"]

logger = logging.getLogger("acollect")

_SEND_RETRY = 1.0
# A heartbeat that cannot be queued at once is skipped: the connection is down, and waiting on it would
# stall the loop that notices a dead collector.
_BEAT_TIMEOUT = 0.05
# Silence tolerated once the connection is down too: a live collector's endpoint is reconnected within
# ZeroMQ's reconnect interval (0.1 s), while a stalled event loop (its connection stays up) gets the
# whole heartbeat_timeout.
_DOWN_GRACE = 3.0


def _error_fields(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return {"type": name, "message": str(exc), "traceback": tb}


class _Worker:
    def __init__(self, config: P.WorkerConfig) -> None:
        self.config = config
        self.identity = P.worker_identity(config.index, config.generation)
        self.control = WorkerSocket(config.address, self.identity, keys=config.keys)
        self.engine: BlockingEngine | None = None
        self.lock = threading.RLock()
        # The runner waits here between batches; its collector's credits come here too where it can open it.
        self.pipe = CreditPipe.create(config.pipe)
        # Runner state, guarded by `lock`.
        # One-shot batches asked for (``collect``): each one's number and the shared segment it names (None: any free
        # slot).
        self.requested: deque[tuple[int, int | None]] = deque()
        self.credits: int | None = None  # batches that may be sent ahead, once ``run`` came (None: requests only)
        self.state = LoopState()  # what it is doing (both threads move it, under `lock`)
        self.ring: ShmSlotRing | None = None
        self.interrupt = threading.Event()  # stops the batch in progress at the next step (kept, continued later)
        self.asked = 0  # the highest number of a one-shot request received (under `lock`)
        # Weights, seed and state staged by the control thread for the runner's next batch boundary.
        self.staging = Staging(
            send=self.send,
            engine=lambda: self.engine,
            dist=lambda: self.dist,
            next_request=lambda: self.requested[0][0] if self.requested else self.asked + 1,
            requests_waiting=lambda: bool(self.requested),
            asked=lambda: self.asked,
        )
        self.runner: threading.Thread | None = None
        self.sent = 0  # batches handed to ZeroMQ; heartbeats carry it so a lost batch is noticed
        self.episodes = EpisodeTracker()  # the runner's: episodes travel in each batch header
        self.layout: dict[str, Any] = {}  # this worker's batch layout, as sent in hello
        self.dist: Any = None  # a DistLink once the collector sent ``dist_init`` (DistributedCollector)

    # -- messages -------------------------------------------------------------------
    def _fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {"worker": self.config.index, "gen": self.config.generation, **fields}

    def send(self, kind: str, fields: dict[str, Any] | None = None, *, timeout: float = 10.0) -> None:
        self.control.send(pack_message(kind, self._fields(fields or {})), timeout=timeout)

    def beat(self) -> None:
        engine = self.engine
        steps = engine.steps if engine is not None else 0
        discarded = engine.discarded_frames if engine is not None else 0
        restarts = engine.env_restarts if engine is not None else 0
        alone = _pairs(engine.env_restarts_by_sub_env) if engine is not None else []
        with self.lock:  # read together: while a batch is begun, ``sent`` is its seq
            busy = self.state.collecting
            partial, sent = busy or (engine is not None and engine.in_batch), self.sent
        fields = {
            "steps": steps,
            "busy": busy,
            "partial": partial,
            "sent": sent,
            "discarded": discarded,
            "env_restarts": restarts,
            "sub_env_restarts": alone,
        }
        with contextlib.suppress(TimeoutError):
            self.send(P.HEARTBEAT, fields, timeout=_BEAT_TIMEOUT)

    def report(self, exc: BaseException) -> None:
        with self.lock:
            self.state.fail()
        self.pipe.wake()
        try:
            self.send(P.ERROR, _error_fields(exc))
        except Exception:
            traceback.print_exc()

    # -- main loop ------------------------------------------------------------------
    def run(self) -> int:
        try:
            if self.config.affinity is not None:
                # Before the env is built: the threads it starts (and torch's) inherit the cores. Every thread
                # started so far (the sockets') is pinned with the process. A failure is reported like a bad env.
                pin_process(0, self.config.affinity)
            self.engine = build_engine(self.config, self.interrupt)
            layout, _ = encode_tensordict(self.engine.allocate())
            self.layout = layout
        except Exception as exc:
            self.report(exc)
            return self.control_loop()
        with self.lock:
            self.state.built()
        self.send(
            P.HELLO,
            {
                "pid": os.getpid(),
                "protocol": PROTOCOL_VERSION,
                "n_envs": self.engine.n_envs,
                "layout": layout,
                # What a weight push must fit, so the collector refuses a bad one before sending it.
                "weights": encode_structure(self.engine.policy.weights_module),
                # An env seeded only when built (EnvPool): the collector refuses set_seed() and warns of workers
                # sharing seeds itself, at once, instead of a reseed failing here at the next batch.
                "env_seed": self.engine.env.build_seed,
                # Where a collector on this host writes credits (None: it sends them as messages).
                "pipe": self.pipe.path,
            },
        )
        self.runner = threading.Thread(target=self.runner_loop, name="acollect-runner", daemon=True)
        self.runner.start()
        return self.control_loop()

    def _collector_gone(self, silence: float) -> bool:
        """Whether a worker with no parent to watch should give up on its collector (and says why, once)."""
        timeout = self.config.heartbeat_timeout
        grace = min(timeout, max(_DOWN_GRACE, 3 * self.config.heartbeat_interval))
        if silence > timeout:
            why = f"nothing came from it for {silence:.1f}s (heartbeat_timeout={timeout:g}s)"
        elif silence > grace and not self.control.connected:
            why = f"the connection to it is down and nothing came for {silence:.1f}s"
        else:
            return False
        logger.error(
            "acollect worker %d (pid %d): the collector at %s is gone (%s); exiting",
            self.config.index,
            os.getpid(),
            self.config.address,
            why,
        )
        return True

    def control_loop(self) -> int:
        interval = self.config.heartbeat_interval
        # parent_pid 0: the collector runs on another host, or started this worker by hand. No parent to
        # watch, so its heartbeats tell that it lives (it sends them to such workers only).
        watch_collector = not self.config.parent_pid
        next_beat = 0.0
        heard = time.monotonic()
        ppid = os.getppid()
        while True:
            if self.config.parent_pid and not parent_alive(self.config.parent_pid, ppid):
                self.pipe.unlink()  # never opened by the collector, if it died first
                remove_orphans(
                    self.config.parent_pid,
                    [*self.staging.segments, *(self.ring.names if self.ring is not None else ())],
                    self.config.address,
                )
                os._exit(1)  # the collector died: nobody will ever read what we collect
            now = time.monotonic()
            if now >= next_beat:
                self.beat()
                next_beat = now + interval
            frames = self.control.recv(timeout=min(0.2, max(0.0, next_beat - time.monotonic())))
            if frames is None:
                # Judged only when nothing is waiting: after a long command (dist_init) or a starved thread,
                # the heartbeats that queued meanwhile are read first.
                if watch_collector and self._collector_gone(time.monotonic() - heard):
                    return 1
                continue
            heard = time.monotonic()
            header, td = unpack_message(frames, kinds=P.TO_WORKER)
            if header["kind"] == P.STOP:
                return 0
            if header["kind"] == P.HEARTBEAT:
                continue
            try:
                self.handle(header, td)
            except Exception as exc:
                self.report(exc)

    def handle(self, header: dict[str, Any], td: TensorDictBase | None) -> None:
        kind = header["kind"]
        if kind == P.WEIGHTS:
            self.staging.stage_weights(header, td)
            return
        if kind == P.DIST_INIT:
            from acollect._runtime.torch_dist import DistLink

            self.dist = DistLink(header)  # blocks until every rank joined (within the given timeout)
            return
        if kind == P.SEED:
            self.staging.stage_seed(int(header["seed"]))
            return
        if kind == P.LOAD_STATE:
            self.staging.stage_state({k: int(header[k]) for k in ("next_traj_counter", "frames")})
            return
        if kind == P.STATE:
            engine = self.engine
            # Plain ints read without the engine lock: exact between batches, which is when it is asked.
            counters = (
                {"next_traj_counter": engine.next_traj_counter, "frames": engine.frames, "steps": engine.steps}
                if engine is not None
                else {}
            )
            self.send(P.REPLY, {"req": header.get("req"), **counters})
            return
        with self.lock:
            if kind == P.SLOTS:
                # With ``part``: this worker's rows of segments every worker writes (acollect._batches.shared_batches).
                # With ``add``: more slots for a ring whose slots are lent to the trainer (see
                # acollect._batches.lending).
                if header.get("add") and self.ring is not None:
                    self.ring.attach_more(header["names"], part=header.get("part"))
                else:
                    self.ring = ShmSlotRing.attach(header["names"], header["layout"], part=header.get("part"))
            elif kind == P.COLLECT:
                slot = header.get("slot")
                if slot is not None and (self.ring is None or type(slot) is not int or not 0 <= slot < len(self.ring)):
                    raise ValueError(f"collect named slot {slot!r:.20}, which this worker does not have")
                number = header.get("n", self.asked + 1)
                if type(number) is not int or number < 1:
                    raise ValueError(f"collect numbered n={number!r:.20}, expected an int >= 1")
                self.requested.append((number, slot))
                self.asked = max(self.asked, number)
            elif kind == P.RUN:
                self.credits = int(header["credits"])
            elif kind in (P.CREDIT, P.FREE):
                if kind == P.CREDIT and self.credits is not None:
                    self.credits += 1
                slot = header.get("slot")
                if slot is not None and self.ring is not None:
                    self.ring.release(int(slot))
            elif kind == P.PAUSE:
                self.state.pause()
                self.interrupt.set()
            elif kind == P.RESUME:
                self.state.resume()
        self.pipe.wake()  # the runner looks again at what it may do

    # -- the runner thread ---------------------------------------------------------------
    def _named_slot(self) -> int | None:
        """The shared segment the next one-shot batch goes into, if its request named one."""
        return self.requested[0][1] if self.requested else None

    def _take_from_pipe(self) -> None:
        """Applies what the pipe holds: credits, and slots given back (under ``lock``)."""
        for kind, slot in self.pipe.read():
            if kind == CREDIT and self.credits is not None:
                self.credits += 1
            if kind != WAKE and slot >= 0 and self.ring is not None:
                self.ring.release(slot)

    def _has_work(self, holds_slot: bool) -> bool:
        if not self.state.may_collect:
            return False
        if self.ring is not None and self.ring.n_free == 0 and not holds_slot and self._named_slot() is None:
            return False
        return bool(self.requested) or (self.credits is not None and self.credits > 0)

    def runner_loop(self) -> None:
        # A new thread does not follow the main thread's torch.set_num_threads() (OpenMP keeps it per thread): the
        # policy's ops here would start a team of OpenMP threads of their own, spinning beside the runner on a busy
        # machine (a forward of 0.1 ms taking 10).
        torch.set_num_threads(self.config.num_threads)
        engine = self.engine
        assert engine is not None
        data = WorkerSocket(self.config.address, self.identity + b"d", keys=self.config.keys)
        seq = 0
        # A batch a pause stopped half-way keeps its slot (the engine goes on writing into it) and the
        # count of resets it began after.
        held: int | None = None
        began_after = 0
        try:
            while True:
                with self.lock:
                    self._take_from_pipe()
                    if not self._has_work(held is not None):
                        engine.stopwatch.switch(TRAINER)  # no credit, no request, or paused: the trainer's turn
                    while not self._has_work(held is not None):
                        if self.state.stopping:
                            return
                        # Anything that changes what it may do after this look wakes it through the pipe: none is lost.
                        self.lock.release()
                        try:
                            self.pipe.wait(0.5)
                        finally:
                            self.lock.acquire()
                        self._take_from_pipe()
                    engine.stopwatch.switch(OTHER)
                    number = self.requested[0][0] if self.requested else None  # a one-shot request's
                    slot: int | None = held
                    if held is None and self.ring is not None:
                        # A named segment is the collector's to free (it is no credit of this worker's ring).
                        named = self._named_slot()
                        slot = named if named is not None else self.ring.acquire()
                    held = None
                    self.interrupt.clear()
                    self.state.begin()
                try:
                    with self.staging.engine_lock:
                        resets = self.staging.apply_pending(number)
                        if not engine.in_batch:  # a new batch (a reseed may have given up the one held)
                            began_after = resets
                        # With slots, the engine writes straight into shared memory: no copy on this side.
                        out = self.ring[slot].tensordict if slot is not None and self.ring is not None else None
                        batch = engine.collect(self.interrupt, out=out)
                        version, counter, frames = engine.policy_version, engine.next_traj_counter, engine.frames
                        restarts, alone = engine.env_restarts, _pairs(engine.env_restarts_by_sub_env)
                        episodes = self.episodes.update(batch).to_header()
                        spent = engine.stopwatch.take()  # since the last batch: what made this one
                except RolloutInterrupted:
                    # Paused (or stopping): the steps taken stay in the engine and in this slot.
                    with self.lock:
                        self.state.batch_done()
                        held = slot
                    continue
                header = {
                    "seq": seq,
                    "policy_version": version,
                    "traj_counter": counter,
                    "frames": frames,
                    "slot": slot,
                    "episodes": episodes,
                    "resets": began_after,
                    "env_restarts": restarts,
                    "sub_env_restarts": alone,
                    "time": spent,
                }
                if number is not None:
                    header["n"] = number
                if self.dist is not None:  # the header here, the tensors through torch.distributed
                    message = pack_message(P.BATCH, self._fields({**header, "dist": True}))
                elif slot is not None:
                    message = pack_message(P.BATCH, self._fields(header))
                else:
                    message = pack_message(P.BATCH, self._fields(header), batch)
                with self.lock:
                    if number is not None:
                        self.requested.popleft()
                    elif self.credits is not None:
                        self.credits -= 1
                    self.state.batch_done()
                seq += 1
                while not self.state.stopping:
                    try:
                        data.send(message, timeout=_SEND_RETRY)
                        self.sent = seq
                        break
                    except TimeoutError:
                        continue
                if self.dist is not None and not self.state.stopping:
                    self.dist.send_batch([batch.get(tuple(leaf["key"])) for leaf in self.layout["leaves"]])
        except Exception as exc:
            with self.lock:
                self.state.fail()
            try:
                data.send(pack_message(P.ERROR, self._fields(_error_fields(exc))), timeout=10.0)
            except Exception:
                traceback.print_exc()
        finally:
            data.close()

    # -- exit ---------------------------------------------------------------------------
    def close(self) -> None:
        with self.lock:
            self.state.stop()
            self.interrupt.set()
        self.pipe.wake()
        if self.runner is not None:
            # A step stuck in C code or a long sleep cannot be interrupted: do not wait for it (the
            # runner is a daemon thread and dies with the process), and leave its env alone.
            self.runner.join(timeout=1.0)
            if self.runner.is_alive():
                self.engine = None
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                traceback.print_exc()
        if self.ring is not None:
            self.ring.close()
        self.staging.close()
        self.pipe.unlink()
        if self.runner is None or not self.runner.is_alive():  # a runner stuck in an env may still look at it
            self.pipe.close()
        self.control.close()


def run_worker(config: P.WorkerConfig) -> int:
    """Runs one worker until the collector says ``stop`` (or dies). Returns the exit code."""
    # A worker pinned to k cores has num_threads == k (acollect.collectors._worker_configs): one per core.
    torch.set_num_threads(config.num_threads)
    if config.filter_warnings:
        warnings.simplefilter("ignore")
    worker = _Worker(config)
    try:
        return worker.run()
    finally:
        worker.close()


def _pairs(counts: dict[int, int]) -> list[list[int]]:
    """Rebuilds by sub-env as msgpack carries them: ``[[sub-env, rebuilds], ...]`` (map keys must be strings)."""
    return [[i, n] for i, n in sorted(counts.items())]
