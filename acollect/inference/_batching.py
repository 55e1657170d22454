"""What an inference server does between two waits: gather requests, run one forward pass, split the outputs.

Plain synchronous code, run by the server's own thread (see :mod:`acollect.inference._server`):

* :class:`InferenceRequest`: one client's observations (``[n, ...]``) and, once served, its share of the outputs;
* :class:`Batcher`: the pending requests and the rule that says when to run them;
* :class:`Forward`: the policy (wrapped once the first observations show their keys), run on its device
  under ``inference_mode`` on the concatenated observations;
* :class:`InferenceStats`: what the server did (passes, batch sizes, latency).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType

from acollect._devices import move_to, wait_for_stream
from acollect._policy import NestedKey, PolicyAdapter, RandomPolicy, wrap_policy
from acollect._rollout.blocking import exploration
from acollect.errors import PolicyError

__all__ = ["STATS_SIZE", "Batcher", "Forward", "InferenceRequest", "InferenceStats", "Lane", "ServerStatsRecorder"]

_DONE_KEYS = ("done", "terminated", "truncated")
_LATENCY_WINDOW = 1024


Key = tuple[str, ...]


@dataclass(eq=False)
class InferenceRequest:
    """One client's observations (``[rows, ...]`` tensors by key), waiting for (then holding) the policy's outputs."""

    leaves: dict[Key, torch.Tensor]
    rows: int
    #: who to answer: a ZeroMQ routing id, or ``None`` for a caller of ``InferenceServer.infer`` in this process
    route: bytes | None = None
    #: the client's request number, echoed in the reply (a stale reply is recognised by it)
    seq: int = 0
    #: requests from one source count once when the batcher asks whether every source is waiting
    source: bytes | None = None
    arrived: float = field(default_factory=time.monotonic)
    outputs: dict[Key, torch.Tensor] | None = None
    version: int = 0
    error: BaseException | None = None
    #: set by the awaiting task (from its event loop) when it stops waiting: the reply is dropped
    abandoned: bool = False
    #: answers a request that came through a shared-memory slot (writes its actions there and wakes its worker)
    answer: Callable[[InferenceRequest], None] | None = None


class Batcher:
    """Pending requests and when to run them.

    A batch runs as soon as one of these holds: the pending rows reach ``max_batch_size``; every one of
    ``sources`` known sources has a request waiting (nobody else will come, waiting longer only adds
    latency); or the oldest request has waited ``max_wait`` seconds.
    """

    def __init__(self, max_batch_size: int, max_wait: float, sources: int | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self.sources = sources
        self.pending: deque[InferenceRequest] = deque()
        self._rows = 0

    def add(self, request: InferenceRequest) -> None:
        self.pending.append(request)
        self._rows += request.rows

    def deadline(self) -> float | None:
        """When the oldest pending request has waited long enough (``None``: nothing pending)."""
        return self.pending[0].arrived + self.max_wait if self.pending else None

    def ready(self, now: float) -> bool:
        if not self.pending:
            return False
        if self._rows >= self.max_batch_size or now >= self.pending[0].arrived + self.max_wait:
            return True
        if self.sources is not None:
            waiting = {r.source for r in self.pending if r.source is not None}
            return len(waiting) >= self.sources
        return False

    def take(self) -> list[InferenceRequest]:
        """The oldest requests, up to ``max_batch_size`` rows (at least one request, whatever its size)."""
        taken = [self.pending.popleft()]
        rows = taken[0].rows
        while self.pending and rows + self.pending[0].rows <= self.max_batch_size:
            request = self.pending.popleft()
            taken.append(request)
            rows += request.rows
        self._rows -= rows
        return taken

    def drain(self) -> list[InferenceRequest]:
        """Every pending request (the server is closing)."""
        out = list(self.pending)
        self.pending.clear()
        self._rows = 0
        return out


class Lane:
    """What one pass thread keeps from one pass to the next: on a GPU, a CUDA stream of its own and page-locked
    staging buffers, so that its copies go by DMA, overlapped with the other threads' passes.

    Buffers grow to the largest batch seen and are reused: a pass allocates nothing once warm. A pass's outputs
    are views of this lane's buffers until its next pass (:class:`~acollect.inference._passes.PassRunner` copies
    what must outlive that).

    Args:
        device: where the passes run (``None`` or a CPU: no stream, no pinning).
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:  # "cuda": the device current now, fixed for the lane's life
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream: Any = torch.cuda.Stream(self.device) if self.cuda else None
        self._inputs: dict[Key, torch.Tensor] = {}
        self._outputs: dict[NestedKey, torch.Tensor] = {}
        self._copied: dict[Key, Any] = {}  # staging buffer -> the event of the last copy out of it

    def context(self) -> Any:
        """The context a pass runs in: its stream on a GPU."""
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    @staticmethod
    def _buffer(buffers: dict[Any, torch.Tensor], key: Any, like: torch.Tensor, rows: int, pin: bool) -> torch.Tensor:
        buffer = buffers.get(key)
        if buffer is None or buffer.shape[0] < rows or buffer.shape[1:] != like.shape[1:] or buffer.dtype != like.dtype:
            buffer = buffers[key] = torch.empty((rows, *like.shape[1:]), dtype=like.dtype, pin_memory=pin)
        return buffer[:rows]

    def gather(self, key: Key, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``parts`` concatenated along rows, on the lane's device (one DMA from page-locked memory on a GPU)."""
        if not self.cuda:
            if len(parts) == 1:
                return parts[0]  # a slot's own view: no copy at all
            rows = sum(int(p.shape[0]) for p in parts)
            return torch.cat(list(parts), 0, out=self._buffer(self._inputs, key, parts[0], rows, pin=False))
        rows = sum(int(p.shape[0]) for p in parts)
        staged = self._buffer(self._inputs, key, parts[0], rows, pin=True)
        copied = self._copied.pop(key, None)
        if copied is not None:
            # The host writes the staging buffer only once the last copy out of it finished: a pass that failed
            # after its gather never reached to_host's synchronize.
            copied.synchronize()  # a blocking event: asleep, not spinning a core the env workers need
        torch.cat(list(parts), 0, out=staged)
        with torch.cuda.stream(self.stream):  # this lane's stream, whatever the caller's is (see context())
            on_device = staged.to(self.device, non_blocking=True)
            self._copied[key] = event = torch.cuda.Event(blocking=True)
            event.record(self.stream)
        return on_device

    def to_host(self, outputs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, torch.Tensor]:
        """The pass's outputs on the CPU: on a GPU, copied by DMA into page-locked buffers, waited for once."""
        if not self.cuda:
            return {k: v if v.device.type == "cpu" else v.to("cpu") for k, v in outputs.items()}
        host = {}
        # The outputs were made on the caller's current stream (this lane's, inside context()): the copies follow.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for key, value in outputs.items():
                buffer = self._buffer(self._outputs, key, value, int(value.shape[0]), pin=True)
                buffer.copy_(value, non_blocking=True)
                host[key] = buffer
        wait_for_stream(self.stream)  # every copy of this pass, and nothing of the other lanes'
        return host


class Forward:
    """Runs the policy once on the observations of several requests and gives each its outputs.

    Several pass threads may call it at once, each with its own :class:`Lane`: the policy is only read.

    Args:
        module: the server's inference copy of the policy (a ``TensorDictModule``, an ``nn.Module`` taking
            the observation, or a callable on TensorDicts), already on ``device``.
        device: where the forward pass runs.
        exploration_type: the tensordict interaction type set around each pass.
    """

    def __init__(self, module: Any, device: torch.device, exploration_type: InteractionType | None) -> None:
        self.module = module
        self.device = device
        self.exploration_type = exploration_type
        self._adapter: PolicyAdapter | None = None
        self._adapter_lock = threading.Lock()
        # The keys the policy reads, where it says (a TensorDictModule's in_keys, a plain module's observation):
        # only those are concatenated. ``None``: all (a callable may read anything).
        self._reads: set[Key] | None = None

    def _adapter_for(self, requests: Sequence[InferenceRequest]) -> PolicyAdapter:
        with self._adapter_lock:  # the first passes of several threads: one adapter
            if self._adapter is None:
                probe = TensorDict({}, batch_size=[requests[0].rows])
                for key, value in requests[0].leaves.items():
                    probe.set(key, value)
                keys: list[NestedKey] = [
                    k for k in probe.keys(include_nested=True, leaves_only=True) if k not in _DONE_KEYS
                ]
                adapter = wrap_policy(self.module, observation_keys=keys, action_spec=None, batch_size=probe.batch_size)  # type: ignore[arg-type]
                if isinstance(adapter, RandomPolicy):
                    raise PolicyError("an inference server needs a policy: it was given None")
                self._adapter = adapter
                reads = getattr(adapter, "in_keys", None) or getattr(adapter.module, "in_keys", None)
                self._reads = {_as_key(k) for k in reads} if reads else None
            return self._adapter

    def __call__(self, requests: Sequence[InferenceRequest], version: int, lane: Lane | None = None) -> None:
        """Fills ``outputs`` and ``version`` of every request (or raises what the policy raised)."""
        lane = lane if lane is not None else Lane(self.device)
        adapter = self._adapter_for(requests)
        with torch.inference_mode(), exploration(self.exploration_type), lane.context():
            inputs = _concatenate(requests, self.device, self._reads, lane)
            outputs = adapter(inputs)
            rows = inputs.batch_size[0]
            for key, value in outputs.items():
                if value.shape[:1] != (rows,):
                    raise PolicyError(
                        f"the policy wrote {key!r} of shape {tuple(value.shape)} for {rows} observations: expected a "
                        f"leading batch dim of {rows} (one entry per observation)"
                    )
            # One transfer for all requests, then views: each request gets its rows of every output.
            host = lane.to_host(dict(outputs.items()))
        sizes = [r.rows for r in requests]
        chunks = {_as_key(k): torch.split(v, sizes) for k, v in host.items()}
        for i, request in enumerate(requests):
            request.outputs = {key: parts[i] for key, parts in chunks.items()}
            request.version = version


def _as_key(key: NestedKey) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def _concatenate(
    requests: Sequence[InferenceRequest], device: torch.device, reads: set[Key] | None, lane: Lane
) -> TensorDict:
    """One TensorDict of every request's rows on ``device``, with the keys all of them have (clients send
    different extras: a worker its done flags, an evaluation loop only its observation), or only ``reads``."""
    keys = [k for k in requests[0].leaves if reads is None or k in reads]
    if any(r.leaves.keys() != requests[0].leaves.keys() for r in requests[1:]):
        common = set(keys).intersection(*(r.leaves.keys() for r in requests[1:]))
        keys = [k for k in keys if k in common]
    rows = sum(r.rows for r in requests)
    td = TensorDict({}, batch_size=[rows], device=device)
    for key in keys:
        value = lane.gather(key, [r.leaves[key] for r in requests])
        td.set(key, value if value.device == device else move_to(value, device))
    return td


@dataclass
class InferenceStats:
    """What an inference server did so far.

    Attributes:
        passes: forward passes run.
        requests: requests answered.
        rows: observations answered (frames, for a collector).
        slot_requests: requests that came through shared-memory slots (same-host workers), not as messages.
        mean_batch_size: rows per forward pass.
        fill_rate: ``mean_batch_size / max_batch_size``: how full the passes were.
        latency_ms_mean: from a request's arrival to its answer, over the last 1024 requests (milliseconds).
        latency_ms_p50: the median of the same: the server's part of a typical round trip.
        latency_ms_p99: the 99th percentile of the same.
        forward_ms_mean: time of one forward pass, outputs split included (milliseconds).
        policy_version: the version of the weights the next pass runs with.
        dropped_requests: requests from worker connections that were not well-formed, dropped unanswered
            (logged at most once a minute per peer, with the count since the last line).
        rejected_peers: connection attempts refused by the server's CURVE keys (``keys=``): a key not on the
            allow-list, no CURVE, a wrong server key; each attempt of a peer that keeps retrying counts.
        time_split: where the server's loop spent its time since it started, as fractions summing to 1:
            ``"pass"`` (a forward pass running), ``"gathering"`` (requests waiting for more to join them, or for a
            free pass thread) and ``"idle"`` (nothing to do: the workers are stepping); all 0 before it ran.
    """

    passes: int = 0
    requests: int = 0
    rows: int = 0
    slot_requests: int = 0
    mean_batch_size: float = 0.0
    fill_rate: float = 0.0
    latency_ms_mean: float | None = None
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None
    forward_ms_mean: float | None = None
    policy_version: int = 0
    dropped_requests: int = 0
    rejected_peers: int = 0
    time_split: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (for loggers)."""
        return asdict(self)


#: the fields of a stats array, by index; the latency ring follows them
_STATS_FIELDS = (
    "passes",
    "requests",
    "rows",
    "slot_requests",
    "forward_s",
    "dropped_requests",
    "version",
    "pass_started",
    "latency_count",
    "rejected_peers",
    "passing_s",
    "gathering_s",
    "idle_s",
)
_FIELD = {name: i for i, name in enumerate(_STATS_FIELDS)}
#: float64 entries of a stats array: the fields, then the last ``_LATENCY_WINDOW`` latencies (a ring)
STATS_SIZE = len(_STATS_FIELDS) + _LATENCY_WINDOW


def _stats_field(name: str) -> Any:
    index = _FIELD[name]

    def get(self: ServerStatsRecorder) -> float:
        return float(self.figures[index])

    def set_(self: ServerStatsRecorder, value: float) -> None:
        self.figures[index] = value

    return property(get, set_)


class ServerStatsRecorder:
    """Counts passes, rows and latencies, and says which pass runs: written by the server's loop, read by anyone.

    Everything lives in one float64 array, :attr:`figures`: a plain array for a server thread, or one mapped from
    shared memory, so that the trainer reads the figures (and the start of a hung pass) of a server process
    without asking it. Aligned 8-byte writes are atomic here: a reader sees each figure whole.

    Args:
        max_batch_size: for the fill rate.
        figures: ``STATS_SIZE`` float64 entries to keep the figures in (``None``: a fresh private array).

    Examples:
        >>> rec = ServerStatsRecorder(8)
        >>> rec.record([InferenceRequest({}, 4, arrived=0.0)], started=0.0, ended=0.002)
        >>> snap = rec.snapshot()
        >>> snap.passes, snap.rows, snap.fill_rate, round(snap.latency_ms_p50, 3)
        (1, 4, 0.5, 2.0)
    """

    dropped_requests = _stats_field("dropped_requests")
    version = _stats_field("version")
    rejected_peers = _stats_field("rejected_peers")

    def __init__(self, max_batch_size: int, figures: np.ndarray | None = None) -> None:
        self.max_batch_size = max_batch_size
        if figures is None:
            figures = np.zeros(STATS_SIZE, dtype=np.float64)
        if figures.dtype != np.float64 or figures.shape != (STATS_SIZE,):
            raise ValueError(f"a stats array is {STATS_SIZE} float64 entries, got {figures.dtype} {figures.shape}")
        self.figures = figures
        self.figures[_FIELD["pass_started"]] = math.nan

    @property
    def pass_started(self) -> float | None:
        """When the forward pass in progress started (``time.monotonic()``, the same clock in every process of
        this host); ``None`` while none runs. The liveness check reads it, from the event loop or from another
        process: a pass that never returns shows as a hung server, not as hung clients."""
        value = float(self.figures[_FIELD["pass_started"]])
        return None if math.isnan(value) else value

    @pass_started.setter
    def pass_started(self, value: float | None) -> None:
        self.figures[_FIELD["pass_started"]] = math.nan if value is None else value

    def record(self, requests: Sequence[InferenceRequest], started: float, ended: float) -> None:
        figures = self.figures
        figures[_FIELD["passes"]] += 1
        figures[_FIELD["requests"]] += len(requests)
        figures[_FIELD["rows"]] += sum(r.rows for r in requests)
        figures[_FIELD["slot_requests"]] += sum(1 for r in requests if r.answer is not None)
        figures[_FIELD["forward_s"]] += ended - started
        ring = len(_STATS_FIELDS)
        count = int(figures[_FIELD["latency_count"]])
        for request in requests:
            figures[ring + count % _LATENCY_WINDOW] = ended - request.arrived
            count += 1
        figures[_FIELD["latency_count"]] = count

    def charge(self, part: str, seconds: float) -> None:
        """Adds ``seconds`` of the server loop's time to ``part`` (``"passing"``, ``"gathering"`` or ``"idle"``)."""
        self.figures[_FIELD[f"{part}_s"]] += seconds

    def snapshot(self, rejected_peers: int | None = None) -> InferenceStats:
        figures = self.figures.copy()  # one read: the figures of one moment (up to a pass in progress)
        passes, rows = int(figures[_FIELD["passes"]]), int(figures[_FIELD["rows"]])
        count = min(int(figures[_FIELD["latency_count"]]), _LATENCY_WINDOW)
        ring = len(_STATS_FIELDS)
        latencies = sorted(figures[ring : ring + count].tolist())
        mean_batch = rows / passes if passes else 0.0
        return InferenceStats(
            passes=passes,
            requests=int(figures[_FIELD["requests"]]),
            rows=rows,
            slot_requests=int(figures[_FIELD["slot_requests"]]),
            mean_batch_size=mean_batch,
            fill_rate=mean_batch / self.max_batch_size if self.max_batch_size else 0.0,
            latency_ms_mean=1000 * sum(latencies) / len(latencies) if latencies else None,
            latency_ms_p50=1000 * latencies[len(latencies) // 2] if latencies else None,
            latency_ms_p99=1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
            forward_ms_mean=1000 * float(figures[_FIELD["forward_s"]]) / passes if passes else None,
            policy_version=int(figures[_FIELD["version"]]),
            dropped_requests=int(figures[_FIELD["dropped_requests"]]),
            rejected_peers=int(figures[_FIELD["rejected_peers"]]) if rejected_peers is None else rejected_peers,
            time_split=_split(figures),
        )


def _split(figures: np.ndarray) -> dict[str, float]:
    spent = {
        part: float(figures[_FIELD[f"{name}_s"]])
        for part, name in (("pass", "passing"), ("gathering", "gathering"), ("idle", "idle"))
    }
    total = sum(spent.values())
    return {part: (s / total if total > 0 else 0.0) for part, s in spent.items()}
