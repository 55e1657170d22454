"""The inference server's thread: take requests, run forward passes, answer; apply weights between passes.

Plain blocking code. It shares a :class:`Mailbox` with the event loop's side
(:class:`~acollect.inference._server.InferenceServer`): deques, whose appends and pops are atomic, and
two socket pairs, one byte on which wakes the other side (this thread waits on its end together with
the ROUTER socket worker processes send to, a :class:`~acollect._runtime.server_socket.ServerSocket`
polled by a :class:`~acollect._runtime.server_socket.Waiter`; the event loop awaits the other with
:func:`anyio.wait_readable`).
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch
from tensordict import TensorDictBase

from acollect._runtime.server_socket import Ready, ServerSocket, Waiter
from acollect._weights.updates import load_weights
from acollect.errors import ProtocolError
from acollect.inference import _messages as M
from acollect.inference._batching import Batcher, Forward, InferenceRequest, Lane, ServerStatsRecorder
from acollect.inference._codec import Encoder, LayoutCache
from acollect.inference._passes import PassRunner
from acollect.inference._slot_hub import SlotHub

__all__ = ["DropReport", "Mail", "Mailbox", "ServerLoop", "Ticket"]

_IDLE_POLL_MS = 50  # how often an idle server thread looks at its stop event
_CLOSE_PASSES_S = 5.0  # how long a stopping server waits for the passes that run to end
_HOUSEKEEPING_S = 0.1  # how often the loop's owner may refresh what it publishes (a server process's counts)
_REPORT_EVERY = 60.0  # seconds between two log lines about one peer's malformed requests
_MAX_PEERS = 1024  # peers whose malformed requests are reported apart; the rest share one line
_OTHER_PEERS = b""  # the key of the rest (never a ROUTER route: those are not empty)


class DropReport:
    """Logs dropped malformed requests at most once per ``every`` seconds per peer, with the count since.

    Anyone who reaches a server's port can send garbage: one line per message would let them flood the log.
    The first one from a peer is logged at once; later ones are counted, and the next line (once ``every``
    seconds have passed, at that peer's next malformed request) says how many. At most ``max_peers`` peers
    are reported apart (then those silent for ``every`` seconds are forgotten, or the newcomers share one line).

    Examples:
        >>> report = DropReport(every=60.0)
        >>> [report.dropped(b"peer", now=t) for t in (0.0, 1.0, 2.0, 61.0, 62.0)]
        [1, None, None, 3, None]
    """

    def __init__(self, every: float = _REPORT_EVERY, max_peers: int = _MAX_PEERS) -> None:
        self.every = every
        self.max_peers = max_peers
        self._peers: dict[bytes, list[float]] = {}  # route -> [time of its last line, drops since]

    def dropped(self, route: bytes, *, now: float) -> int | None:
        """Counts one drop from ``route``; returns the count to log now (``None``: not yet)."""
        peer = self._peers.get(route)
        if peer is None:
            if len(self._peers) >= self.max_peers:
                self._peers = {r: p for r, p in self._peers.items() if now - p[0] < self.every}
            if len(self._peers) >= self.max_peers:
                route = _OTHER_PEERS
                peer = self._peers.get(route)
            if peer is None:
                peer = self._peers[route] = [-math.inf, 0.0]
        peer[1] += 1
        if now - peer[0] < self.every:
            return None
        count = int(peer[1])
        peer[0], peer[1] = now, 0.0
        return count

    def log(self, route: bytes, error: BaseException, *, now: float) -> None:
        """Counts one drop from ``route`` and logs it if its line is due."""
        count = self.dropped(route, now=now)
        if count is None:
            return
        who = "other peers" if route not in self._peers else repr(route[:64])
        if count == 1:
            M.logger.warning(
                "inference server: dropped a malformed request from %s: %s (further ones are counted in "
                "stats().dropped_requests and logged at most once every %gs)",
                who,
                error,
                self.every,
            )
        else:
            M.logger.warning(
                "inference server: dropped %d malformed requests from %s since the last report; the last one: %s",
                count,
                who,
                error,
            )


class Ticket:
    """A weight update waiting for the server thread to apply it (``version`` is set once it is).

    ``ready``: the events of :func:`~acollect._devices.cuda_ready`, recorded by the caller as it handed the weights
    over (CUDA weights may still be written by work queued on its streams).
    """

    def __init__(self, weights: TensorDictBase, ready: tuple[Any, ...] = ()) -> None:
        self.weights = weights
        self.ready = ready
        self.version = 0
        self.error: BaseException | None = None
        self.abandoned = False


class Mail(Protocol):
    """What the server's loop uses of its mail: a :class:`Mailbox` shared with the event loop in this process, or a
    server process's control socket (:class:`~acollect.inference._process_main.ControlMailbox`)."""

    #: requests from clients in this process, for the loop
    inbox: deque[InferenceRequest]
    #: weight updates, for the loop
    tickets: deque[Ticket]

    def fileno(self) -> int:
        """The descriptor the loop waits on for its mail."""
        ...

    def receive(self) -> None:
        """Takes what woke the loop (the requests and tickets land in :attr:`inbox` and :attr:`tickets`)."""
        ...

    def answer(self, item: InferenceRequest | Ticket) -> None:
        """Hands ``item``, answered or applied, back to whoever sent it."""
        ...


class Mailbox:
    """What the event loop and the server thread hand each other."""

    def __init__(self) -> None:
        self.inbox: deque[InferenceRequest] = deque()  # in-process requests, for the thread
        self.tickets: deque[Ticket] = deque()  # weight updates, for the thread
        self.answered: deque[InferenceRequest | Ticket] = deque()  # for the event loop
        self.wake_r, self.wake_w = socket.socketpair()  # event loop -> server thread
        self.done_r, self.done_w = socket.socketpair()  # server thread -> event loop
        for sock in (self.wake_r, self.wake_w, self.done_r, self.done_w):
            sock.setblocking(False)

    def fileno(self) -> int:
        """The descriptor the server's loop waits on for its mail."""
        return self.wake_r.fileno()

    def receive(self) -> None:
        """Takes what woke the server's loop (here: the wake-up bytes; the requests are in the deques)."""
        with contextlib.suppress(BlockingIOError):
            self.wake_r.recv(4096)

    def poke(self) -> None:
        """Wakes the server thread (from the event loop)."""
        with contextlib.suppress(BlockingIOError, OSError):  # a full pair already holds a wake-up
            self.wake_w.send(b"\0")

    def answer(self, item: InferenceRequest | Ticket) -> None:
        """Hands ``item`` back to the event loop and wakes it (from the server thread)."""
        self.answered.append(item)
        with contextlib.suppress(BlockingIOError, OSError):
            self.done_w.send(b"\0")

    def close(self) -> None:
        for sock in (self.wake_r, self.wake_w, self.done_r, self.done_w):
            sock.close()


class ServerLoop:
    """The body of the server thread.

    Args:
        mailbox: shared with the event loop's side.
        batcher: the pending requests and when to run them.
        forward: the policy's pass.
        recorder: statistics.
        sock: the ROUTER socket worker processes send to (``None``: in-process clients only); the thread
            owns it while it runs.
        close_socket: called when the thread ends because it was told to stop.
        hub: the shared-memory slots of same-host workers (``None``: messages only); the thread owns it while it
            runs, and ``close_socket`` closes it.
        in_flight: forward passes that may run at once (:class:`~acollect.inference._passes.PassRunner`).
        torch_threads: torch's threads in the loop thread and each pass thread (``None``: leave them): OpenMP keeps
            the count per thread, so a thread that does not set it runs a team as large as the machine.
    """

    def __init__(
        self,
        mailbox: Mail,
        batcher: Batcher,
        forward: Forward,
        recorder: ServerStatsRecorder,
        sock: ServerSocket | None,
        close_socket: Callable[[], None],
        hub: SlotHub | None = None,
        in_flight: int = 1,
        torch_threads: int | None = None,
    ) -> None:
        self.in_flight = in_flight
        self.torch_threads = torch_threads
        self.mail = mailbox
        self.batcher = batcher
        self.forward = forward
        self.recorder = recorder
        self.sock = sock
        self.hub = hub
        self._close_socket = close_socket
        #: called about every 0.1 s between passes (a server process publishes its refused-peer count there)
        self.housekeeping: Callable[[], None] | None = None
        self._layouts = LayoutCache(M.TO_SERVER)
        self._encoder = Encoder()
        self._drops = DropReport()
        #: what a forward pass raised, which ended the loop: the policy's failure (else the loop's end was not the
        #: policy's, say a message that broke the protocol); a server process tells its trainer which it was
        self.failed_pass: BaseException | None = None
        if hub is not None:
            hub.on_malformed = self._dropped

    @property
    def version(self) -> int:
        """Version of the weights the next forward pass runs with (kept in the stats array)."""
        return int(self.recorder.version)

    @version.setter
    def version(self, value: int) -> None:
        self.recorder.version = value

    def configure(self, **settings: int | None) -> None:
        """Changes ``max_batch_size`` or ``sources`` (see :class:`~acollect.inference._batching.Batcher`), from the
        next pass on."""
        if "max_batch_size" in settings:
            value = settings["max_batch_size"]
            assert value is not None
            self.batcher.max_batch_size = self.recorder.max_batch_size = value
        if "sources" in settings:
            self.batcher.sources = settings["sources"]

    def serve(self, stop: threading.Event) -> None:
        """Runs until ``stop`` is set; raises what the policy raised (after answering its callers)."""
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)  # this thread's own count (see torch_threads)
        done_r, done_w = socket.socketpair()  # a pass thread -> this thread: a pass ended
        done_r.setblocking(False)
        done_w.setblocking(False)
        fds = [self.mail.fileno(), done_r.fileno(), *(self.hub.fds() if self.hub is not None else ())]
        waiter = Waiter(fds, self.sock)
        if self.hub is not None:
            self.hub.on_fds = waiter.watch

        def woken() -> None:
            with contextlib.suppress(BlockingIOError, OSError):  # a full pair already holds a wake-up
                done_w.send(b"\0")

        device = self.forward.device
        runner = PassRunner(
            self.forward,
            in_flight=self.in_flight,
            on_done=woken,
            make_lane=lambda: Lane(device),
            answer=self._answer_from_pass,
            record=self.recorder.record,
            running=lambda started: setattr(self.recorder, "pass_started", started),
            torch_threads=self.torch_threads,
            # One pass at a time on a CPU: nothing to overlap, so this thread runs it (no hand-offs, no GIL shared
            # with a pass thread); on a GPU a pass thread still waits for the device while this one gathers.
            inline=self.in_flight == 1 and getattr(device, "type", "cpu") != "cuda",
        )
        batcher = self.batcher
        housekept = 0.0
        # Where this loop's time goes (stats().inference's time_split): charged to what it was doing since the
        # last turn, a pass running, requests waiting, or nothing.
        charged, doing = time.monotonic(), "idle"
        try:
            while not stop.is_set():
                now = time.monotonic()
                self.recorder.charge(doing, now - charged)
                charged = now
                wait = 0  # a pass is due: only see what else is there
                if not (runner.free and batcher.ready(now)):
                    # Capped, so that a stop is seen within _IDLE_POLL_MS even while a long max_wait runs.
                    wait = _IDLE_POLL_MS
                    deadline = batcher.deadline()
                    if deadline is not None and runner.free:
                        wait = min(wait, max(0, int((deadline - now) * 1000 + 0.999)))
                ready = waiter.wait(wait)
                if done_r.fileno() in ready.fds:
                    with contextlib.suppress(BlockingIOError):
                        done_r.recv(4096)
                self._take_requests(ready)
                self._finish(runner)
                if self.mail.tickets and runner.busy == 0:
                    self._apply_weights()  # between passes: none runs while the weights change
                if self.housekeeping is not None and now - housekept > _HOUSEKEEPING_S:
                    housekept = now
                    self.housekeeping()
                # No new pass while weights wait: they apply as soon as the passes running now are done.
                submitted = False
                while not self.mail.tickets and runner.free and batcher.ready(time.monotonic()):
                    if not submitted:  # up to here: what it was doing; from here: passes (inline on a CPU)
                        now = time.monotonic()
                        self.recorder.charge(doing, now - charged)
                        charged, doing, submitted = now, "passing", True
                    runner.submit(batcher.take(), self.version)
                if submitted:
                    now = time.monotonic()
                    self.recorder.charge("passing", now - charged)
                    charged = now
                doing = "passing" if runner.busy else "gathering" if batcher.pending else "idle"
        except BaseException as exc:
            self._answer_all(exc)
            raise
        finally:
            runner.close(_CLOSE_PASSES_S)
            with contextlib.suppress(BaseException):
                self._finish(runner)
            self._answer_all(None)
            done_r.close()
            done_w.close()
            if stop.is_set():
                self._close_socket()

    @staticmethod
    def _answer_from_pass(request: InferenceRequest) -> bool:
        """Answers ``request`` from the thread that ran its pass where that is safe, a slot (the worker's own
        connection); a ZeroMQ client and a caller in this process are answered by this loop's thread, which owns
        their sockets."""
        if request.answer is not None:
            request.answer(request)
            return True
        return False

    def _finish(self, runner: PassRunner) -> None:
        """Answers what the passes that ended left to this thread; raises a pass's failure (its callers told)."""
        for done in runner.finished():
            if done.error is not None:
                self.failed_pass = done.error
                for request in done.requests:  # the callers of this pass get the policy's own error
                    if request.route is None and request.answer is None:
                        request.error = done.error
                        self.mail.answer(request)
                raise done.error
            for request in done.requests:
                if request.route is not None:
                    self._reply(request)
                else:
                    self.mail.answer(request)

    def _take_requests(self, ready: Ready) -> None:
        """Takes the requests of whatever the wait found readable (and what the mail holds)."""
        if self.mail.fileno() in ready.fds:
            self.mail.receive()
        inbox = self.mail.inbox
        while inbox:
            request = inbox.popleft()
            if not request.abandoned:
                self.batcher.add(request)
        if self.hub is not None and ready.fds:
            self.hub.take(self.batcher, ready.fds)
        sock = self.sock if ready.socket else None
        while sock is not None:
            received = sock.recv_nowait()
            if received is None:
                break
            route, frames = received
            try:
                message = self._layouts.decode(frames)
            except ProtocolError as exc:
                self._dropped(route, exc)
                continue
            self.batcher.add(InferenceRequest(message.leaves, message.rows, route=route, seq=message.seq, source=route))

    def _dropped(self, route: bytes, error: BaseException) -> None:
        self.recorder.dropped_requests += 1
        self._drops.log(route, error, now=time.monotonic())

    def _apply_weights(self) -> None:
        tickets = self.mail.tickets
        while tickets:
            ticket = tickets.popleft()
            if not ticket.abandoned:
                try:
                    # Landed before the next pass is even queued (passes run on their lanes' streams).
                    load_weights(self.forward.module, ticket.weights, ticket.ready, checked=True)
                    self.version += 1
                    ticket.version = self.version
                except Exception as exc:  # weights checked on the way in: this would be a device error
                    ticket.error = exc
            self.mail.answer(ticket)

    def _reply(self, request: InferenceRequest) -> None:
        sock = self.sock
        if sock is None or request.outputs is None or request.route is None:
            return
        frames = self._encoder.frames(M.REPLY, request.seq, request.version, request.rows, request.outputs)
        # False (not taken) means a client that vanished or stopped reading: a ROUTER drops its answer.
        sock.send_nowait(request.route, frames, copy=M.copy_frames(frames))

    def _answer_all(self, error: BaseException | None) -> None:
        """Answers every request still waiting (with ``error``, or with nothing: the server closed)."""
        for request in [*self.batcher.drain(), *self.mail.inbox]:
            if request.route is None and request.answer is None:
                request.error = error
                self.mail.answer(request)
        self.mail.inbox.clear()
        for ticket in self.mail.tickets:
            ticket.error = error
            self.mail.answer(ticket)
        self.mail.tickets.clear()
