"""One worker as the collector sees it: a state machine whose methods are the events that move it.

A :class:`WorkerHandle` owns everything the collector knows of one worker slot: which process holds it (its
generation), its restarts, and small parts with one job each: its hello (:mod:`~acollect._workers.worker_hello`), its
shared memory (:mod:`~acollect._workers.worker_memory`), its heartbeats (:mod:`~acollect._workers.heartbeats`), its
batches in order (:mod:`~acollect._workers.batch_sequence`), its lockstep requests and parts
(:mod:`~acollect._workers.lockstep_requests`), the commands it was sent and its weight acks
(:mod:`~acollect._workers.worker_commands`). Nobody else writes any of it: the receive loop, the liveness loop, the
pool and the dispatch strategies call the methods that are the events (:meth:`~WorkerHandle.on_launch`,
:meth:`~WorkerHandle.on_hello`, :meth:`~WorkerHandle.on_beat`, :meth:`~WorkerHandle.on_batch`,
:meth:`~WorkerHandle.on_death`, ...; an event of one part only is that part's method), and read the rest through
properties. A caller names the part it reads or calls (``handle.heartbeats.last_beat``,
``handle.lockstep.on_ask(...)``): the handle does not pass its parts' names through, so where a thing lives shows at
the call.
The slot's state is one :class:`WorkerState`, moved through :data:`WORKER` (the table ``docs/concepts.md`` shows).

Examples:
    >>> from acollect._workers.protocol import WorkerConfig
    >>> config = WorkerConfig(index=0, generation=0, n_workers=1, address="", parent_pid=0)
    >>> handle = WorkerHandle(0, config)
    >>> handle.state
    <WorkerState.NEW: 'new'>
    >>> handle.on_launch(now=0.0)
    >>> handle.state, handle.generation
    (<WorkerState.STARTING: 'starting'>, 1)
    >>> handle.on_hello({"n_envs": 2, "layout": {"leaves": [{"nbytes": 64}]}})
    >>> handle.hello.n_envs, handle.hello.batch_nbytes
    (2, 64)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDictBase

from acollect._runtime.machine import StateTable
from acollect._workers import protocol as P
from acollect._workers.batch_sequence import BatchSequence
from acollect._workers.heartbeats import Heartbeats
from acollect._workers.launcher import LaunchedWorker
from acollect._workers.lockstep_requests import CollectRequest, LockstepRequests, Received
from acollect._workers.protocol import Rejected, parse_identity
from acollect._workers.worker_commands import WorkerCommands
from acollect._workers.worker_hello import WorkerHello
from acollect._workers.worker_memory import WorkerMemory
from acollect.errors import ProtocolError

__all__ = [
    "WORKER",
    "CollectRequest",
    "Received",
    "Rejected",
    "WorkerHandle",
    "WorkerMode",
    "WorkerState",
    "parse_identity",
]


@dataclass
class WorkerMode:
    """What every worker is under, set by the collector's dispatch strategy and told again at each hello."""

    paused: bool = False
    running: bool = False  # ``run`` was sent (asynchronous collectors): workers collect on their credits


class WorkerState(enum.Enum):
    """Where one worker slot is, as the collector sees it."""

    NEW = "new"
    STARTING = "starting"
    VACANT = "vacant"
    READY = "ready"
    UNREACHABLE = "unreachable"
    DEAD = "dead"
    LOST = "lost"
    STOPPING = "stopping"


_W = WorkerState
_RESTARTED = "it died (an exit code, a heartbeat gone stale, no progress) or did not start in time: a new process"
WORKER: StateTable[WorkerState] = StateTable(
    "worker",
    {
        _W.NEW: "the pool holds its config; nothing is started yet",
        _W.STARTING: "a process of a new generation was launched (or a worker started by hand joined) and has not "
        "said hello yet: it is sent nothing",
        _W.VACANT: "a slot for a worker started by hand (`acollect worker`): waiting for one to join",
        _W.READY: "it said hello and was greeted (its slots, the last weights, the mode, its requests): it takes "
        "commands and sends batches",
        _W.UNREACHABLE: "a message to it failed: its connection is gone (it died, or is dying); nothing more is "
        "sent to it, and the liveness loop decides",
        _W.DEAD: "it died and its restarts are spent: the pool fails with its error (with `on_worker_loss="
        '"continue"`, only when it was the last worker left)',
        _W.LOST: "it died (or a worker started by hand left) with its restarts spent, under `on_worker_loss="
        '"continue"`: dropped for good, sent nothing, left out of batches; the others collect on',
        _W.STOPPING: "the pool is closing: it is told to stop, then ended",
    },
    {
        (_W.NEW, _W.STARTING): "the pool launched its process",
        (_W.NEW, _W.VACANT): "the pool opened the slot for a worker started by hand",
        (_W.NEW, _W.STOPPING): "the pool closed before starting it",
        (_W.STARTING, _W.STARTING): _RESTARTED,
        (_W.STARTING, _W.READY): "it said hello and was greeted",
        (_W.STARTING, _W.VACANT): "a worker started by hand left before its hello: the slot waits for another",
        (_W.STARTING, _W.UNREACHABLE): "a message to it failed",
        (_W.STARTING, _W.DEAD): "it died or did not start in time, and its restarts are spent",
        (_W.STARTING, _W.LOST): "it died or did not start in time, its restarts are spent, and other workers are left",
        (_W.STARTING, _W.STOPPING): "the pool closes",
        (_W.VACANT, _W.STARTING): "a worker started by hand joined and got its config",
        (_W.VACANT, _W.VACANT): "nobody joined within `startup_timeout` (a restart is counted): the slot waits on",
        (_W.VACANT, _W.DEAD): "nobody joined, and its restarts are spent",
        (_W.VACANT, _W.LOST): "nobody joined, its restarts are spent, and other workers are left",
        (_W.VACANT, _W.STOPPING): "the pool closes",
        (_W.READY, _W.STARTING): _RESTARTED,
        (_W.READY, _W.VACANT): "a worker started by hand died or left: the slot waits for another",
        (_W.READY, _W.UNREACHABLE): "a message to it failed",
        (_W.READY, _W.DEAD): "it died, and its restarts are spent",
        (_W.READY, _W.LOST): "it died, its restarts are spent, and other workers are left",
        (_W.READY, _W.STOPPING): "the pool closes",
        (_W.UNREACHABLE, _W.STARTING): _RESTARTED,
        (_W.UNREACHABLE, _W.VACANT): "a worker started by hand is gone: the slot waits for another",
        (_W.UNREACHABLE, _W.DEAD): "it is gone, and its restarts are spent",
        (_W.UNREACHABLE, _W.LOST): "it is gone, its restarts are spent, and other workers are left",
        (_W.UNREACHABLE, _W.STOPPING): "the pool closes",
        (_W.DEAD, _W.STOPPING): "the pool closes",
        (_W.LOST, _W.STOPPING): "the pool closes",
    },
)


class WorkerHandle:
    """What the collector knows about one worker slot; its methods are the events that change it.

    Args:
        index: the slot's index (its worker id).
        config: the config every incarnation in this slot is started from.
    """

    __slots__ = (
        "_batches",
        "_commands",
        "_config",
        "_generation",
        "_heartbeats",
        "_hello",
        "_index",
        "_lockstep",
        "_memory",
        "_process",
        "_restarts",
        "_started_at",
        "_state",
        "_unreachable_since",
    )

    def __init__(self, index: int, config: P.WorkerConfig) -> None:
        self._index = index
        self._config = config
        self._state = WorkerState.NEW
        self._process: LaunchedWorker | None = None
        self._generation = 0
        self._started_at = 0.0
        self._restarts = 0
        self._unreachable_since: float | None = None
        self._hello = WorkerHello()  # the last one: a restarted worker says it again
        self._memory = WorkerMemory()
        self._heartbeats = Heartbeats(index)
        self._batches = BatchSequence(index)
        self._lockstep = LockstepRequests(index)
        self._commands = WorkerCommands()

    # -- the state -----------------------------------------------------------------------------
    @property
    def state(self) -> WorkerState:
        """Where the slot is (:class:`WorkerState`)."""
        return self._state

    @property
    def ready(self) -> bool:
        """Whether it takes commands (``READY``)."""
        return self._state is WorkerState.READY

    @property
    def lost(self) -> bool:
        """Whether it was dropped for good (``LOST``, under ``on_worker_loss="continue"``): sent nothing, left out of
        batches and weight pushes."""
        return self._state is WorkerState.LOST

    @property
    def stopping(self) -> bool:
        """Whether the pool is closing it (``STOPPING``)."""
        return self._state is WorkerState.STOPPING

    @property
    def joined(self) -> bool:
        """Whether a worker started by hand holds the slot (from its join until it leaves)."""
        return self.config.remote and self._state in (WorkerState.STARTING, WorkerState.READY, WorkerState.UNREACHABLE)

    # -- what it is --------------------------------------------------------------------------------
    @property
    def index(self) -> int:
        """The slot's index (its worker id)."""
        return self._index

    @property
    def config(self) -> P.WorkerConfig:
        """The config every incarnation in this slot is started from."""
        return self._config

    @property
    def process(self) -> LaunchedWorker | None:
        """The launched process of this generation (``None`` while launching, or for a worker started by hand)."""
        return self._process

    @property
    def generation(self) -> int:
        """Which incarnation holds the slot (each start or join is a new one, with a new identity)."""
        return self._generation

    @property
    def started_at(self) -> float:
        """When this incarnation was launched or joined (``time.monotonic()``)."""
        return self._started_at

    @property
    def restarts(self) -> int:
        """Restarts so far (a dead worker replaced, or a slot freed again for a worker started by hand)."""
        return self._restarts

    @property
    def identity(self) -> bytes:
        """The ZeroMQ identity of this incarnation's control socket."""
        return P.worker_identity(self.index, self._generation)

    @property
    def pid(self) -> int | None:
        """Its process id, where the launcher knows it."""
        return self._process.pid if self._process is not None else None

    @property
    def where(self) -> str:
        """How messages name this worker's process: ``"pid 123"``, ``"Ray actor 1f2e..."``..."""
        return self._process.describe() if self._process is not None else f"pid {self.pid}"

    @property
    def unreachable_since(self) -> float | None:
        """When a message to this incarnation first failed (``None``: none did)."""
        return self._unreachable_since

    # -- its parts ---------------------------------------------------------------------------------
    @property
    def hello(self) -> WorkerHello:
        """What its last hello said (the defaults before its first one)."""
        return self._hello

    @property
    def memory(self) -> WorkerMemory:
        """The shared memory it owns: the slots its batches are written into, its pipe."""
        return self._memory

    @property
    def heartbeats(self) -> Heartbeats:
        """When it was last heard from, its progress, what it holds of a batch."""
        return self._heartbeats

    @property
    def batches(self) -> BatchSequence:
        """Its batches in order: the next expected, one missing, the late ones of a dead incarnation, the counters."""
        return self._batches

    @property
    def lockstep(self) -> LockstepRequests:
        """Its ``collect`` requests not answered yet and its parts not taken yet (lockstep collectors)."""
        return self._lockstep

    @property
    def commands(self) -> WorkerCommands:
        """The commands sent to this incarnation that its batches count, and its answers to weight pushes."""
        return self._commands

    # -- incarnations ----------------------------------------------------------------------------------
    def _new_incarnation(self, now: float) -> None:
        """Forgets what the collector knew of the previous process in this slot: a new one takes it."""
        self._generation += 1
        self._process = None
        self._commands.on_new_incarnation()
        self._lockstep.on_new_incarnation()
        self._heartbeats.on_new_incarnation()
        self._batches.on_new_incarnation()
        self._unreachable_since = None
        self._started_at = now
        self._memory.drop_credit_pipe()

    def on_launch(self, now: float) -> None:
        """A process of a new generation is being launched into the slot (:meth:`on_process` follows)."""
        self._state = WORKER.move(self._state, WorkerState.STARTING)
        self._new_incarnation(now)

    def on_process(self, process: LaunchedWorker) -> None:
        """The launcher started this generation's process (called from the launching thread, as soon as it exists:
        a launch cancelled half-way still leaves a process the pool knows of, and stops)."""
        self._process = process

    def on_vacate(self, now: float) -> None:
        """The slot waits for a worker started by hand, under a new generation."""
        self._state = WORKER.move(self._state, WorkerState.VACANT)
        self._new_incarnation(now)

    def on_join(self, now: float) -> None:
        """A worker started by hand took the slot (it gets its config now, and says hello next)."""
        self._state = WORKER.move(self._state, WorkerState.STARTING)
        self._started_at = now

    def on_join_failed(self) -> None:
        """The config could not reach the worker that joined: it left already; the slot waits for another."""
        self._state = WORKER.move(self._state, WorkerState.VACANT)

    def on_hello(self, header: dict[str, Any]) -> None:
        """It said hello: what it built (the pool greets it next, then :meth:`on_greeted`)."""
        self._hello = WorkerHello.parse(header)
        self._memory.on_hello(self._hello.pipe)

    def on_greeted(self, now: float) -> None:
        """The pool told it what it needs (slots, the last weights, the mode, its requests): it is ``READY``."""
        self._state = WORKER.move(self._state, WorkerState.READY)
        self._heartbeats.on_greeted(now)

    def on_unreachable(self, now: float) -> bool:
        """A message to it failed: its connection is gone. Returns whether this is the first failure noticed."""
        first = self._unreachable_since is None
        if first:
            self._unreachable_since = now
        if self._state in (WorkerState.READY, WorkerState.STARTING):
            self._state = WORKER.move(self._state, WorkerState.UNREACHABLE)  # nothing more is sent to this incarnation
        return first

    # -- what it sends -----------------------------------------------------------------------------------
    def on_beat(self, header: dict[str, Any], now: float) -> int:
        """A heartbeat; returns the frames it stepped and gave up since the last one (a held batch it reseeded)."""
        discarded = self._heartbeats.on_beat(header, now)
        self._batches.on_sent(int(header.get("sent", 0)), now)
        return discarded

    def on_batch(self, header: dict[str, Any], td: TensorDictBase | None, *, lockstep: bool) -> Received:
        """A batch arrived: checks its sequence number and slot, and returns it; a lockstep part also waits in its
        inbox, answering its oldest request.

        Raises:
            Rejected: a replayed batch (dropped and counted, not a failure).
            ProtocolError: a batch out of order, naming a slot it does not have, with no data, or unasked for.
        """
        self._batches.check(header)
        slot, ring = header.get("slot"), self._memory.ring
        if slot is not None:
            if ring is None or type(slot) is not int or not 0 <= slot < len(ring):
                raise ProtocolError(f"worker {self.index} named slot {slot!r:.20}, which it does not have")
            data: TensorDictBase = ring[slot].tensordict
        elif td is not None:
            data = td
        else:
            raise ProtocolError(f"worker {self.index} sent a batch with neither slot nor tensors")
        request = self._lockstep.answer(header) if lockstep else None
        self._batches.on_batch(header)
        nbytes = self._hello.batch_nbytes
        item = Received(self.index, self._generation, header, data, slot is not None, nbytes, request)
        if lockstep:
            self._lockstep.file(item)
        return item

    # -- death ------------------------------------------------------------------------------------------
    def on_death(self, *, lockstep: bool, running: bool) -> int:
        """It died and is replaced: counts a restart and returns the batches it held, which are lost.

        ``running``: asynchronous workers collect on their credits (a batch in progress dies with it). A lockstep
        worker's every outstanding request is asked again of its successor: running ahead it may hold two (the part
        it finished, whose message can die with it in its socket's queue, and the next one it began). An
        asynchronous one's batches that arrive after this are dropped too (its successor reuses their trajectory
        ids): each is counted as it comes (:meth:`BatchSequence.on_late`), except the one in progress at its last
        heartbeat, counted here.
        """
        self._restarts += 1
        self._memory.drop_credit_pipe()
        return self._retire(lockstep=lockstep, running=running)

    def on_lost(self, *, lockstep: bool, running: bool) -> int:
        """It died (or left) with its restarts spent and others are left: it is dropped for good. Returns the batches
        it held, which are lost; those of its batches that arrive after this are dropped as they come, as for a
        worker replaced (:meth:`on_death`, here with no restart counted)."""
        self._memory.drop_credit_pipe()
        self._state = WORKER.move(self._state, WorkerState.LOST)
        lost = self._retire(lockstep=lockstep, running=running)
        if lockstep:
            self._lockstep.on_lost()  # nobody will answer its requests: a lockstep batch takes the live workers' parts
        return lost

    def _retire(self, *, lockstep: bool, running: bool) -> int:
        """This incarnation is over: returns the batches it held, which are lost (see :meth:`on_death`)."""
        in_progress = running and self._heartbeats.partial
        self._batches.retire(None if lockstep else self._generation, in_progress=in_progress)
        if lockstep:
            return self._lockstep.outstanding
        return 1 if self._lockstep.outstanding or in_progress else 0

    def on_dead(self) -> None:
        """It died and will not be replaced (its restarts are spent, or the pool is closing)."""
        self._memory.drop_credit_pipe()
        if self._state is not WorkerState.STOPPING:
            self._state = WORKER.move(self._state, WorkerState.DEAD)

    def on_stopping(self) -> None:
        """The pool closes: it is told to stop, then ended."""
        if self._state is not WorkerState.STOPPING:
            self._state = WORKER.move(self._state, WorkerState.STOPPING)

    def release(self) -> None:
        """The pool closed: unmaps and removes its slots, forgets what was queued. Idempotent."""
        self._memory.release()
        self._lockstep.release()

    def __repr__(self) -> str:
        return f"WorkerHandle({self.index}, {self._state.name}, generation={self._generation}, {self.where})"
