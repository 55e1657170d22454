"""One worker as the collector sees it: a state machine whose methods are the events that move it.

A :class:`WorkerHandle` owns everything the collector knows of one worker slot: which process holds it
(its generation), what it said in its hello, its liveness (heartbeats, progress, batches announced and
received), the requests it was sent and the batches it answered, its weights acknowledgements, its
restarts. Nobody else writes any of it: the receive loop, the liveness loop, the pool and the dispatch
strategies call the methods that are the events (:meth:`~WorkerHandle.on_launch`,
:meth:`~WorkerHandle.on_hello`, :meth:`~WorkerHandle.on_beat`, :meth:`~WorkerHandle.on_batch`,
:meth:`~WorkerHandle.on_death`, ...), and read the rest through properties. The slot's state is one
:class:`WorkerState`, moved through :data:`WORKER` (the table ``docs/concepts.md`` shows).

Examples:
    >>> from acollect._workers.protocol import WorkerConfig
    >>> config = WorkerConfig(index=0, generation=0, n_workers=1, address="", parent_pid=0)
    >>> handle = WorkerHandle(0, config)
    >>> handle.state
    <WorkerState.NEW: 'new'>
    >>> handle.on_launch(now=0.0)
    >>> handle.state, handle.generation
    (<WorkerState.STARTING: 'starting'>, 1)
    >>> handle.ready
    False
"""

from __future__ import annotations

import enum
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDictBase

from acollect._batches.doorbell import DoorbellWriter, remove_doorbell
from acollect._batches.slot_ring import ShmSlotRing
from acollect._runtime.machine import StateTable
from acollect._weights.updates import WeightStructure, decode_structure
from acollect._workers import protocol as P
from acollect._workers.launcher import LaunchedWorker
from acollect.errors import ProtocolError

__all__ = [
    "WORKER",
    "Orders",
    "Received",
    "Rejected",
    "Request",
    "WorkerHandle",
    "WorkerState",
    "parse_identity",
]

# ``w<index>.<generation>`` (control socket) or the same plus ``d`` (data socket): see worker_identity.
_IDENTITY = re.compile(rb"w(\d{1,9})\.(\d{1,9})d?")


def parse_identity(identity: bytes) -> tuple[int, int] | None:
    """``(worker index, generation)`` from a ZeroMQ identity, or ``None`` if it names no worker."""
    match = _IDENTITY.fullmatch(identity)
    if match is None:
        return None
    return int(match[1]), int(match[2])


class Rejected(Exception):
    """A message that is dropped and counted, not a failure: it did not come from a live worker."""


@dataclass
class Request:
    """One ``collect`` request to a worker (lockstep collectors): which batch its answer is a part of."""

    number: int  # the lockstep batch (numbered by the collector from 1, the same for every worker)
    slot: int | None = None  # the shared segment it names (a successor is asked again into the same rows)
    ahead: bool = False  # made before the caller asked for that batch (see Lockstep: such a part may be stale)

    def fields(self) -> dict[str, Any]:
        """The ``collect`` message's fields."""
        return {"n": self.number} if self.slot is None else {"n": self.number, "slot": self.slot}


@dataclass
class Received:
    """One batch as received: its header and data (views into a slot, or over message frames)."""

    worker: int
    generation: int
    header: dict[str, Any]
    data: TensorDictBase
    in_slot: bool
    nbytes: int = 0  # the batch's tensor bytes (as the worker's hello layout says)
    request: Request | None = None  # the ``collect`` it answers (lockstep collectors)


@dataclass
class Orders:
    """What every worker is under, set by the collector's dispatch strategy and told again at each hello."""

    paused: bool = False
    running: bool = False  # ``run`` was sent (asynchronous collectors): workers collect on their credits


@dataclass(frozen=True)
class _Retired:
    """An incarnation that died, so each of its batches that arrives late is counted as dropped once."""

    generation: int
    next_seq: int  # its first batch neither received nor counted yet
    counted_seq: int | None  # the batch it was collecting at its last heartbeat: counted at its death


class _InHand(enum.Enum):
    """What a worker holds of a batch, per its last heartbeat (``busy`` and ``partial`` in it; busy implies partial)."""

    NOTHING = "nothing"  # no batch begun and not sent
    STEPPING = "stepping"  # stepping a batch (a hung env shows as stepping with no steps)
    HELD = "held"  # a batch begun and not sent, not stepping: held by a pause


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
        _W.READY: "it said hello and was greeted (its slots, the last weights, the orders, its requests): it takes "
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
        "_acked_version",
        "_batch_nbytes",
        "_bell_made",
        "_bell_path",
        "_changes_sent",
        "_config",
        "_discarded_frames",
        "_doorbell",
        "_env_restarts",
        "_env_seed",
        "_frames",
        "_generation",
        "_in_hand",
        "_inbox",
        "_index",
        "_last_beat",
        "_last_progress",
        "_last_steps",
        "_layout",
        "_missing_since",
        "_n_envs",
        "_next_seq",
        "_process",
        "_requests",
        "_resets_sent",
        "_restarts",
        "_retired",
        "_retired_rings",
        "_ring",
        "_sent",
        "_started_at",
        "_state",
        "_traj_counter",
        "_unreachable_since",
        "_weights_refused",
        "_weights_structure",
    )  # fmt: skip

    def __init__(self, index: int, config: P.WorkerConfig) -> None:
        self._index = index
        self._config = config
        self._state = WorkerState.NEW
        self._process: LaunchedWorker | None = None
        self._generation = 0
        self._started_at = 0.0
        self._restarts = 0
        # What its hello said (the last one: a restarted worker says it again).
        self._n_envs = 0
        self._layout: dict[str, Any] | None = None
        self._batch_nbytes = 0
        self._weights_structure: WeightStructure | None = None
        self._env_seed: int | None = None
        # Where its batches are written (same host), and its predecessors' rings, still read by batches queued.
        self._ring: ShmSlotRing | None = None
        self._retired_rings: list[ShmSlotRing] = []
        # Its doorbell (acollect._batches.doorbell): where this incarnation makes it, whether its hello said it did,
        # and this end of it once opened.
        self._bell_path: str | None = None
        self._bell_made = False
        self._doorbell: DoorbellWriter | None = None
        # Lockstep: ``collect`` requests not answered yet, in order, and the parts received and not taken yet.
        self._requests: deque[Request] = deque()
        self._inbox: deque[Received] = deque()
        # Commands sent to this incarnation that change it at a batch boundary (P.BOUNDARY) or start its envs
        # afresh (P.RESETS): its batches count those they began after.
        self._changes_sent = 0
        self._resets_sent = 0
        # Liveness, from its heartbeats and batches.
        self._last_beat = 0.0
        self._last_steps = -1
        self._last_progress = 0.0
        self._in_hand = _InHand.NOTHING
        self._discarded_frames = 0
        self._env_restarts = 0
        self._sent = 0
        self._next_seq = 0
        self._missing_since: float | None = None
        self._unreachable_since: float | None = None
        self._retired: _Retired | None = None
        # Its counters (the last batch's), which a successor starts from.
        self._traj_counter = 0
        self._frames = 0
        self._acked_version = 0
        self._weights_refused: tuple[int, str] | None = None

    # -- the state -----------------------------------------------------------------------------
    def _move(self, to: WorkerState) -> None:
        self._state = WORKER.move(self._state, to)

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

    # -- what its hello said -------------------------------------------------------------------------
    @property
    def n_envs(self) -> int:
        """Envs it steps (``0`` before its first hello)."""
        return self._n_envs

    @property
    def layout(self) -> dict[str, Any] | None:
        """Its batch layout (``None`` before its first hello)."""
        return self._layout

    @property
    def batch_nbytes(self) -> int:
        """Tensor bytes of one of its batches (from its layout)."""
        return self._batch_nbytes

    @property
    def weights_structure(self) -> WeightStructure | None:
        """Its policy's weights, as its hello said (``None``: unknown)."""
        return self._weights_structure

    @property
    def env_seed(self) -> int | None:
        """The seed its env was built with where only building seeds it (EnvPool), as its hello said; else ``None``."""
        return self._env_seed

    @property
    def ring(self) -> ShmSlotRing | None:
        """The shared-memory slots its batches are written into (``None``: batches come as frames)."""
        return self._ring

    @property
    def bell_path(self) -> str | None:
        """Where its doorbell is, once its hello said it made it there (``None``: it has none)."""
        return self._bell_path if self._bell_made else None

    @property
    def doorbell(self) -> DoorbellWriter | None:
        """This incarnation's doorbell, open (``None``: its credits go as messages)."""
        return self._doorbell

    def make_doorbell(self, path: str | None) -> None:
        """This incarnation (being launched) makes its doorbell at ``path`` (``None``: none)."""
        self._drop_doorbell()
        self._bell_path = path

    def use_doorbell(self, doorbell: DoorbellWriter) -> None:
        """Its credits and the slots given back go down ``doorbell`` (opened at its hello) from now on."""
        self._doorbell = doorbell

    def _drop_doorbell(self) -> None:
        """This incarnation is over: its doorbell is closed, and removed if its worker left it behind."""
        bell, path = self._doorbell, self._bell_path
        self._doorbell, self._bell_path, self._bell_made = None, None, False
        if bell is not None:
            bell.close()
        if path is not None:
            remove_doorbell(path)

    # -- requests and parts (lockstep) ------------------------------------------------------------------
    @property
    def requests(self) -> tuple[Request, ...]:
        """``collect`` requests not answered yet, oldest first."""
        return tuple(self._requests)

    @property
    def outstanding(self) -> int:
        """``collect`` requests not answered yet."""
        return len(self._requests)

    @property
    def inbox(self) -> tuple[Received, ...]:
        """Parts received and not taken yet (lockstep collectors), oldest first."""
        return tuple(self._inbox)

    def asked(self, number: int) -> bool:
        """Whether it was asked for its part of batch ``number`` (answered or not)."""
        return any(r.number == number for r in self._requests) or self.part(number) is not None

    def part(self, number: int) -> Received | None:
        """Its part of batch ``number``, if received and not taken yet."""
        return next((item for item in self._inbox if item.request is not None and item.request.number == number), None)

    def on_ask(self, request: Request) -> None:
        """The collector asks it for a part (sent now if ``READY``; a successor is asked again at its hello)."""
        self._requests.append(request)

    def take_part(self, number: int) -> Received:
        """Removes and returns its part of batch ``number`` (it must be there: see :meth:`part`)."""
        item = self.part(number)
        assert item is not None, f"worker {self.index} has no part of batch {number}"
        self._inbox.remove(item)
        return item

    # -- messages sent ---------------------------------------------------------------------------------
    @property
    def changes_sent(self) -> int:
        """``P.BOUNDARY`` messages sent to this incarnation."""
        return self._changes_sent

    @property
    def resets_sent(self) -> int:
        """``P.RESETS`` messages sent to this incarnation (its batches count those they began after)."""
        return self._resets_sent

    def on_send(self, kind: str) -> None:
        """A command of ``kind`` goes to it now (counted before it goes: the worker counts it on arrival)."""
        if kind in P.BOUNDARY:
            self._changes_sent += 1
        if kind in P.RESETS:
            self._resets_sent += 1

    @property
    def unreachable_since(self) -> float | None:
        """When a message to this incarnation first failed (``None``: none did)."""
        return self._unreachable_since

    def on_unreachable(self, now: float) -> bool:
        """A message to it failed: its connection is gone. Returns whether this is the first failure noticed."""
        first = self._unreachable_since is None
        if first:
            self._unreachable_since = now
        if self._state in (WorkerState.READY, WorkerState.STARTING):
            self._move(WorkerState.UNREACHABLE)  # nothing more is sent to this incarnation
        return first

    # -- incarnations ----------------------------------------------------------------------------------
    def _new_incarnation(self, now: float) -> None:
        """Forgets what the collector knew of the previous process in this slot: a new one takes it."""
        self._generation += 1
        self._process = None
        self._acked_version = 0
        self._changes_sent = self._resets_sent = 0
        for request in self._requests:  # asked again of the successor, which begins them after every change
            request.ahead = False
        self._last_steps, self._in_hand, self._discarded_frames = -1, _InHand.NOTHING, 0
        self._env_restarts = 0
        self._next_seq, self._missing_since, self._sent = 0, None, 0
        self._unreachable_since = None
        self._started_at = now
        self._drop_doorbell()

    def on_launch(self, now: float) -> None:
        """A process of a new generation is being launched into the slot (:meth:`on_process` follows)."""
        self._move(WorkerState.STARTING)
        self._new_incarnation(now)

    def on_process(self, process: LaunchedWorker) -> None:
        """The launcher started this generation's process (called from the launching thread, as soon as it exists:
        a launch cancelled half-way still leaves a process the pool knows of, and stops)."""
        self._process = process

    def on_vacate(self, now: float) -> None:
        """The slot waits for a worker started by hand, under a new generation."""
        self._move(WorkerState.VACANT)
        self._new_incarnation(now)

    def on_join(self, now: float) -> None:
        """A worker started by hand took the slot (it gets its config now, and says hello next)."""
        self._move(WorkerState.STARTING)
        self._started_at = now

    def on_join_failed(self) -> None:
        """The config could not reach the worker that joined: it left already; the slot waits for another."""
        self._move(WorkerState.VACANT)

    def on_hello(self, header: dict[str, Any]) -> None:
        """It said hello: what it built (the pool greets it next, then :meth:`on_greeted`)."""
        self._n_envs = int(header["n_envs"])
        self._layout = header["layout"]
        self._weights_structure = decode_structure(header.get("weights"))
        seed = header.get("env_seed")
        self._env_seed = None if seed is None else int(seed)
        self._batch_nbytes = sum(int(leaf["nbytes"]) for leaf in header["layout"]["leaves"])
        # Opened only where this collector named it: a worker never makes it open another path.
        self._bell_made = self._bell_path is not None and header.get("doorbell") == self._bell_path
        if self._ring is not None:
            # A restarted worker gets fresh slots: batches still queued from its predecessor keep theirs.
            self._retired_rings.append(self._ring)
            self._ring = None

    def use_ring(self, ring: ShmSlotRing) -> None:
        """Its batches are written into ``ring`` (told to the worker with the ``slots`` message)."""
        self._ring = ring

    def on_greeted(self, now: float) -> None:
        """The pool told it what it needs (slots, the last weights, the orders, its requests): it is ``READY``."""
        self._move(WorkerState.READY)
        self._last_beat = self._last_progress = now

    # -- liveness ----------------------------------------------------------------------------------------
    @property
    def last_beat(self) -> float:
        """When it was last heard from (any message)."""
        return self._last_beat

    @property
    def last_steps(self) -> int:
        """Env steps taken, per its last heartbeat (``-1`` before one)."""
        return self._last_steps

    @property
    def last_progress(self) -> float:
        """When its step count last moved (or it began a batch)."""
        return self._last_progress

    @property
    def busy(self) -> bool:
        """Whether it is stepping a batch, per its last heartbeat (a hung env shows as busy with no steps)."""
        return self._in_hand is _InHand.STEPPING

    @property
    def partial(self) -> bool:
        """Whether it holds a batch begun and not sent (stepping, or held by a pause): lost if it dies."""
        return self._in_hand is not _InHand.NOTHING

    @property
    def sent(self) -> int:
        """Batches this incarnation had sent, per its last heartbeat."""
        return self._sent

    @property
    def next_seq(self) -> int:
        """The sequence number of the next batch this incarnation sends."""
        return self._next_seq

    @property
    def missing_since(self) -> float | None:
        """When a heartbeat first said a batch was sent that has not arrived (``None``: none is missing)."""
        return self._missing_since

    def on_message(self, now: float) -> None:
        """Anything came from it: it lives."""
        self._last_beat = now

    def on_beat(self, header: dict[str, Any], now: float) -> int:
        """A heartbeat; returns the frames it stepped and gave up since the last one (a held batch it reseeded)."""
        steps, busy = int(header["steps"]), bool(header["busy"])
        self._sent = int(header.get("sent", 0))
        if steps != self._last_steps or (busy and not self.busy):
            self._last_steps, self._last_progress = steps, now
        if busy:
            self._in_hand = _InHand.STEPPING
        else:
            self._in_hand = _InHand.HELD if header.get("partial", False) else _InHand.NOTHING
        discarded = int(header.get("discarded", 0))
        newly = max(0, discarded - self._discarded_frames)
        self._discarded_frames = max(self._discarded_frames, discarded)
        # Batches travel on another connection than heartbeats, so one may be overtaken; a batch still
        # missing a heartbeat_timeout later was lost (a dropped connection loses what it held).
        if self._sent <= self._next_seq:
            self._missing_since = None
        elif self._missing_since is None:
            self._missing_since = now
        return newly

    def on_env_restarts(self, count: Any) -> int:
        """The envs its process rebuilt so far, as a heartbeat or a batch says; returns those not counted yet."""
        if type(count) is not int or count < 0:
            raise ProtocolError(f"worker {self._index} sent env_restarts={count!r:.20}: expected an int >= 0")
        newly = max(0, count - self._env_restarts)
        self._env_restarts = max(self._env_restarts, count)
        return newly

    # -- batches ---------------------------------------------------------------------------------------
    @property
    def traj_counter(self) -> int:
        """Its next trajectory id counter, as of its last batch (a successor starts from it)."""
        return self._traj_counter

    @property
    def frames(self) -> int:
        """Frames it collected, as of its last batch (a successor starts from it)."""
        return self._frames

    def restore_counters(self, traj_counter: int, frames: int) -> None:
        """Counters restored from a collector state dict (sent to it, and to any successor with its config)."""
        self._traj_counter, self._frames = traj_counter, frames

    def on_batch(self, header: dict[str, Any], td: TensorDictBase | None, *, lockstep: bool) -> Received:
        """A batch arrived: checks its sequence number and slot, and returns it; a lockstep part also waits in its
        inbox, answering its oldest request.

        Raises:
            Rejected: a replayed batch (dropped and counted, not a failure).
            ProtocolError: a batch out of order, naming a slot it does not have, with no data, or unasked for.
        """
        seq = header.get("seq")
        if type(seq) is not int:
            raise ProtocolError(f"worker {self.index} sent a batch with seq={seq!r:.20}, expected an int")
        if seq < self._next_seq:
            raise Rejected(f"replayed batch: seq {seq} from worker {self.index}, expected {self._next_seq}")
        if seq > self._next_seq:
            raise ProtocolError(f"worker {self.index} sent batch {seq} after {self._next_seq - 1}: batches lost")
        slot = header.get("slot")
        if slot is not None:
            if self._ring is None or type(slot) is not int or not 0 <= slot < len(self._ring):
                raise ProtocolError(f"worker {self.index} named slot {slot!r:.20}, which it does not have")
            data: TensorDictBase = self._ring[slot].tensordict
        elif td is not None:
            data = td
        else:
            raise ProtocolError(f"worker {self.index} sent a batch with neither slot nor tensors")
        request = None
        if lockstep:
            if not self._requests:
                raise ProtocolError(f"worker {self.index} sent a batch nobody asked for")
            number = header.get("n", self._requests[0].number)
            if number != self._requests[0].number:
                raise ProtocolError(
                    f"worker {self.index} answered collect n={number!r:.20}, asked for n={self._requests[0].number}"
                )
            request = self._requests.popleft()
        self._next_seq += 1
        self._missing_since = None
        self._traj_counter = int(header["traj_counter"])
        self._frames = int(header["frames"])
        item = Received(self.index, self._generation, header, data, slot is not None, self._batch_nbytes, request)
        if lockstep:
            self._inbox.append(item)
        return item

    def on_late(self, generation: int, header: dict[str, Any]) -> bool:
        """A message of a dead incarnation arrived: whether it is a batch to count as dropped (once)."""
        retired = self._retired
        if retired is None or retired.generation != generation:
            return False  # lockstep (counted with its request), or an older incarnation
        seq = header.get("seq")
        if header["kind"] != P.BATCH or type(seq) is not int or seq < retired.next_seq:
            return False  # not a batch, or one received or counted already (a replay)
        self._retired = _Retired(retired.generation, seq + 1, retired.counted_seq)
        return seq != retired.counted_seq

    # -- weights ---------------------------------------------------------------------------------------
    @property
    def acked_version(self) -> int:
        """The last weights version this incarnation acknowledged."""
        return self._acked_version

    @property
    def weights_refused(self) -> tuple[int, str] | None:
        """``(version, why)`` of the last push it refused (it keeps its previous weights)."""
        return self._weights_refused

    def on_ack(self, header: dict[str, Any]) -> tuple[int, str] | None:
        """It acknowledged a push, or refused it (returns ``(version, why)`` then)."""
        if header.get("error") is not None:
            self._weights_refused = (int(header["version"]), str(header["error"])[:2000])
            return self._weights_refused
        self._acked_version = max(self._acked_version, int(header["version"]))
        return None

    # -- death ------------------------------------------------------------------------------------------
    def on_death(self, *, lockstep: bool, running: bool) -> int:
        """It died and is replaced: counts a restart and returns the batches it held, which are lost.

        ``running``: asynchronous workers collect on their credits (a batch in progress dies with it). A lockstep
        worker's every outstanding request is asked again of its successor: running ahead it may hold two (the part
        it finished, whose message can die with it in its socket's queue, and the next one it began). An
        asynchronous one's batches that arrive after this are dropped too (its successor reuses their trajectory
        ids): each is counted as it comes (:meth:`on_late`), except the one in progress at its last heartbeat,
        counted here.
        """
        self._restarts += 1
        self._drop_doorbell()
        in_progress = running and self.partial
        if lockstep:
            self._retired = None
            return len(self._requests)
        self._retired = _Retired(self._generation, self._next_seq, self._sent if in_progress else None)
        return 1 if self._requests or in_progress else 0

    def on_lost(self, *, lockstep: bool, running: bool) -> int:
        """It died (or left) with its restarts spent and others are left: it is dropped for good. Returns the batches
        it held, which are lost; those of its batches that arrive after this are dropped as they come, as for a
        worker replaced (:meth:`on_death`, here with no restart counted)."""
        in_progress = running and self.partial
        self._drop_doorbell()
        self._move(WorkerState.LOST)
        if lockstep:
            self._retired = None
            lost = len(self._requests)
            self._requests.clear()  # nobody will answer them: a lockstep batch takes the live workers' parts
            self._inbox.clear()
            return lost
        self._retired = _Retired(self._generation, self._next_seq, self._sent if in_progress else None)
        return 1 if self._requests or in_progress else 0

    def on_dead(self) -> None:
        """It died and will not be replaced (its restarts are spent, or the pool is closing)."""
        self._drop_doorbell()
        if self._state is not WorkerState.STOPPING:
            self._move(WorkerState.DEAD)

    def on_stopping(self) -> None:
        """The pool closes: it is told to stop, then ended."""
        if self._state is not WorkerState.STOPPING:
            self._move(WorkerState.STOPPING)

    def release(self) -> None:
        """The pool closed: unmaps and removes its slots, forgets what was queued. Idempotent."""
        for ring in [*self._retired_rings, *([self._ring] if self._ring is not None else [])]:
            ring.close()
            ring.unlink()
        self._ring, self._retired_rings = None, []
        self._inbox.clear()
        self._drop_doorbell()

    def __repr__(self) -> str:
        return f"WorkerHandle({self.index}, {self._state.name}, generation={self._generation}, {self.where})"
