"""The control protocol between a collector and its worker processes.

Every message is a wire message (:func:`acollect._runtime.wire.pack_message`):
a msgpack header whose ``"kind"`` is one of the names below, plus raw tensor
frames for batches and weights. Nothing a worker sends is ever unpickled. One
message may carry a pickle, the other way: the ``config`` of a worker started by
hand whose env factory or policy is a Python object (cloudpickled, see
:mod:`acollect._workers.config_codec`), which the worker unpickles only once the
CURVE handshake proved the collector, and never with ``--no-pickle``.

Collector -> worker:

=============  ====================================================================
``slots``      ``names``, ``layout``: attach these shared-memory slots for batches; ``part``: only these rows
               of each (an index or ``[start, stop)`` of the first dim), which every worker writes its own of
``collect``    collect exactly one batch (synchronous collectors); ``slot``: into this slot (a shared one);
               ``n``: the lockstep batch it is a part of (numbered by the collector from 1; without it, the
               worker numbers its requests itself)
``run``        ``credits``: keep collecting while credits last (asynchronous ones)
``credit``     ``slot`` (optional): one batch was consumed; its slot is free again
``weights``    ``version``, ``models``: new weights, applied at the next batch boundary; ``from``: not before
               the ``collect`` numbered so (without it: to the requests received after them)
``pause``      stop stepping at the next step; a batch in progress is kept, and continued at ``resume``
``resume``     go on collecting
``seed``       ``seed``: reseed env and RNGs at the next batch boundary
``state``      ``req``: reply with the worker's counters
``load_state`` ``next_traj_counter``, ``frames``: restore counters
``stop``       finish and exit
``dist_init``  ``backend``, ``init_method``, ``rank``, ``world_size``, ``timeout``: join torch.distributed;
               from then on batch tensors and weights flagged ``dist`` travel there
``config``     ``index``, ``generation`` and ``plain`` (msgpack fields) or ``pickled``: the config of a
               worker started by hand (answers ``join``; ``refused`` says why there is none)
``heartbeat``  (no fields) the collector is alive: sent every ``heartbeat_interval`` to workers that may
               have no parent process to watch (started by hand, or by an engine on another host); such a
               worker exits when its collector goes silent (see ``WorkerConfig.heartbeat_timeout``)
=============  ====================================================================

Worker -> collector:

=============  ====================================================================
``hello``      ``pid``, ``protocol``, ``n_envs``, ``layout``, ``nbytes``: ready to collect; ``weights``: the
               structure of its policy's weights, ``[[key, shape, dtype], ...]`` (``[]``: none; ``None``:
               too large to send), which every push is checked against before it is sent; ``env_seed``: the
               seed its env was built with where only building seeds it (EnvPool), else ``None``
``batch``      ``seq``, ``policy_version``, ``traj_counter``, ``slot`` or tensor frames; ``resets``: how many
               ``seed`` and ``load_state`` messages the worker had received when it began the batch; ``n``:
               the number of the ``collect`` it answers (none for batches sent on credits); ``env_restarts``:
               the envs it rebuilt so far (``env_errors="restart"``)
``ack``        ``version``: these weights are in the worker (applied or staged); with ``error``, the
               worker refused them (they do not fit its policy, or the message was malformed: ``version``
               is -1 when it had none) and keeps collecting with the weights it had
``reply``      ``req`` and the fields asked for
``heartbeat``  ``steps``, ``busy``, ``partial``, ``sent``: the rollout engine's progress; ``busy``: stepping
               a batch; ``partial``: a batch begun and not sent yet (stepping, or held by a pause); batches sent
               so far (while ``partial``, also the ``seq`` of the batch in progress); ``discarded``: frames
               given up; ``env_restarts``: the envs it rebuilt so far
``error``      ``type``, ``message``, ``traceback``: an exception in env or policy
``join``       ``protocol``, ``pid``, ``host``, ``pickle``: a worker started by hand asks for a config
               (sent from a socket of its own; carries no ``worker`` index yet)
=============  ====================================================================

Every worker -> collector header also carries ``worker`` (the index) and ``gen``
(which incarnation of that worker: a restarted worker has a new one, so a late
message from a dead incarnation is recognised and dropped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from acollect._rollout.spec import RolloutSpec

__all__ = [
    "ACK",
    "BATCH",
    "BOUNDARY",
    "COLLECT",
    "CONFIG",
    "CREDIT",
    "DIST_INIT",
    "ERROR",
    "FREE",
    "HEARTBEAT",
    "HEARTBEAT_TIMEOUT",
    "HELLO",
    "JOIN",
    "LOAD_STATE",
    "PAUSE",
    "REPLY",
    "RESETS",
    "RESUME",
    "RUN",
    "SEED",
    "SLOTS",
    "STATE",
    "STOP",
    "TO_COLLECTOR",
    "TO_WORKER",
    "WEIGHTS",
    "Rejected",
    "WorkerConfig",
    "parse_identity",
    "worker_identity",
]

# both directions: a sign of life (the worker's carries its progress)
HEARTBEAT = "heartbeat"
#: Seconds without a sign of life (or, while collecting, an env step) before either side gives the other up:
#: the default of the collectors' ``heartbeat_timeout`` option, which every worker's config carries.
HEARTBEAT_TIMEOUT = 30.0

# collector -> worker
SLOTS = "slots"
COLLECT = "collect"
RUN = "run"
CREDIT = "credit"
#: a slot given back without a credit: the batch it held was lent to the caller, who dropped it only now
FREE = "free"
WEIGHTS = "weights"
PAUSE = "pause"
RESUME = "resume"
SEED = "seed"
STATE = "state"
LOAD_STATE = "load_state"
STOP = "stop"
CONFIG = "config"
DIST_INIT = "dist_init"
#: What changes the next batch a worker begins (applied at a batch boundary, never inside a batch). A
#: lockstep collector collects ahead only after a batch that none of these preceded (see
#: acollect.collectors._dispatch.Lockstep).
BOUNDARY = frozenset({WEIGHTS, SEED, LOAD_STATE})
#: What starts the envs afresh: a batch begun before the last of these reached its worker is dropped and
#: counted (it would otherwise be handed out after the caller asked for a fresh, seeded start).
RESETS = frozenset({SEED, LOAD_STATE})
TO_WORKER = frozenset(
    {
        SLOTS,
        COLLECT,
        RUN,
        CREDIT,
        FREE,
        WEIGHTS,
        PAUSE,
        RESUME,
        SEED,
        STATE,
        LOAD_STATE,
        STOP,
        CONFIG,
        DIST_INIT,
        HEARTBEAT,
    }
)

# worker -> collector
HELLO = "hello"
BATCH = "batch"
ACK = "ack"
REPLY = "reply"
ERROR = "error"
JOIN = "join"
TO_COLLECTOR = frozenset({HELLO, BATCH, ACK, REPLY, HEARTBEAT, ERROR, JOIN})


class Rejected(Exception):
    """A message the collector drops and counts, not a failure: it did not come from a live worker (or replays one)."""


def worker_identity(index: int, generation: int) -> bytes:
    """The ZeroMQ identity of one incarnation of worker ``index``.

    Examples:
        >>> worker_identity(3, 1)
        b'w3.1'
    """
    return f"w{index}.{generation}".encode()


# ``w<index>.<generation>`` (control socket) or the same plus ``d`` (data socket): see worker_identity.
_IDENTITY = re.compile(rb"w(\d{1,9})\.(\d{1,9})d?")


def parse_identity(identity: bytes) -> tuple[int, int] | None:
    """``(worker index, generation)`` from a ZeroMQ identity, or ``None`` if it names no worker."""
    match = _IDENTITY.fullmatch(identity)
    if match is None:
        return None
    return int(match[1]), int(match[2])


@dataclass
class WorkerConfig:
    """Everything a worker process needs to build its rollout engine.

    It reaches a local worker through the process-creation channel (same host,
    same user). A worker started by hand (``remote``) gets it in a ``config``
    message over a CURVE-authenticated connection, and its own keys (``keys``)
    never leave its machine.
    """

    index: int
    generation: int
    n_workers: int
    address: str
    parent_pid: int
    #: what its engine is built from, as the collector made it (its share of each batch, its trajectory ids);
    #: ``None`` only for a slot's bookkeeping in tests
    rollout: RolloutSpec | None = None
    num_threads: int = 1
    #: the cores this worker pins itself to at its start, before it builds its env (``None``: not pinned);
    #: a list, so that the config stays plain msgpack (see :mod:`acollect._workers.config_codec`)
    affinity: list[int] | None = None
    filter_warnings: bool = True
    heartbeat_interval: float = 0.5
    #: A worker with no parent process to watch (``parent_pid`` 0) exits after this long without a
    #: message from its collector (sooner once its connection is down too: see :mod:`acollect._workers.main`).
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    next_traj_counter: int = 0
    frames: int = 0
    remote: bool = False
    keys: Any = None
    #: where this worker makes its pipe, a FIFO its collector (on the same host) writes credits to; the
    #: collector names it, so that it can remove it even if the worker dies before saying it exists (``None``:
    #: an anonymous pipe, and credits come as messages; see :mod:`acollect._batches.slot_ring`)
    pipe: str | None = None
    #: central inference: ``{"address": ..., "keys": ...}`` of the inference server that chooses this worker's
    #: actions (the worker then gets no policy of its own); ``keys``, a ``ClientKeys`` the server accepts, when
    #: it has keys (never sent to a worker started by hand: that one uses its own ``keys``)
    inference: dict[str, Any] | None = None
