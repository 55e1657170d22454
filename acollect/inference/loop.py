"""The inference server's thread: take requests, run forward passes, answer; apply weights between passes.

Plain blocking code. It shares a :class:`Mailbox` with the event loop's side
(:class:`~acollect.inference.server.InferenceServer`): deques, whose appends and pops are atomic, and
two socket pairs, one byte on which wakes the other side (this thread waits on its end together with
the ROUTER socket worker processes send to, a :class:`~acollect.transport.server_socket.ServerSocket`
polled by a :class:`~acollect.transport.server_socket.Waiter`; the event loop awaits the other with
:func:`anyio.wait_readable`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase

from acollect.errors import ProtocolError
from acollect.inference import protocol as P
from acollect.inference.batching import Batcher, Forward, Request, StatsRecorder
from acollect.inference.codec import Encoder, LayoutCache
from acollect.transport.server_socket import ServerSocket, Waiter

__all__ = ["Mailbox", "ServerLoop", "Ticket"]

_IDLE_POLL_MS = 50  # how often an idle server thread looks at its stop event


class Ticket:
    """A weight update waiting for the server thread to apply it (``version`` is set once it is)."""

    def __init__(self, weights: TensorDictBase) -> None:
        self.weights = weights
        self.version = 0
        self.error: BaseException | None = None
        self.abandoned = False


class Mailbox:
    """What the event loop and the server thread hand each other."""

    def __init__(self) -> None:
        self.inbox: deque[Request] = deque()  # in-process requests, for the thread
        self.tickets: deque[Ticket] = deque()  # weight updates, for the thread
        self.answered: deque[Request | Ticket] = deque()  # for the event loop
        self.wake_r, self.wake_w = socket.socketpair()  # event loop -> server thread
        self.done_r, self.done_w = socket.socketpair()  # server thread -> event loop
        for sock in (self.wake_r, self.wake_w, self.done_r, self.done_w):
            sock.setblocking(False)

    def poke(self) -> None:
        """Wakes the server thread (from the event loop)."""
        with contextlib.suppress(BlockingIOError, OSError):  # a full pair already holds a wake-up
            self.wake_w.send(b"\0")

    def answer(self, item: Request | Ticket) -> None:
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
    """

    def __init__(
        self,
        mailbox: Mailbox,
        batcher: Batcher,
        forward: Forward,
        recorder: StatsRecorder,
        sock: ServerSocket | None,
        close_socket: Callable[[], None],
    ) -> None:
        self.mail = mailbox
        self.batcher = batcher
        self.forward = forward
        self.recorder = recorder
        self.sock = sock
        self._close_socket = close_socket
        #: version of the weights the next forward pass runs with
        self.version = 0
        self._layouts = LayoutCache(P.TO_SERVER)
        self._encoder = Encoder()

    def serve(self, stop: threading.Event) -> None:
        """Runs until ``stop`` is set; raises what the policy raised (after answering its callers)."""
        waiter = Waiter([self.mail.wake_r.fileno()], self.sock)
        batcher = self.batcher
        try:
            while not stop.is_set():
                now = time.monotonic()
                if not batcher.ready(now):
                    # Capped, so that a stop is seen within _IDLE_POLL_MS even while a long max_wait runs.
                    wait = _IDLE_POLL_MS
                    deadline = batcher.deadline()
                    if deadline is not None:
                        wait = min(wait, max(0, int((deadline - now) * 1000 + 0.999)))
                    waiter.wait(wait)
                self._take_requests()
                self._apply_weights()
                while batcher.ready(time.monotonic()):
                    self._run(batcher.take())
        except BaseException as exc:
            self._answer_all(exc)
            raise
        finally:
            self._answer_all(None)
            if stop.is_set():
                self._close_socket()

    def _take_requests(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self.mail.wake_r.recv(4096)
        inbox = self.mail.inbox
        while inbox:
            request = inbox.popleft()
            if not request.abandoned:
                self.batcher.add(request)
        sock = self.sock
        while sock is not None:
            received = sock.recv_nowait()
            if received is None:
                break
            route, frames = received
            try:
                message = self._layouts.decode(frames)
            except ProtocolError as exc:
                P.logger.warning("inference server: dropped a malformed request from %r: %s", route, exc)
                continue
            self.batcher.add(Request(message.leaves, message.rows, route=route, seq=message.seq, source=route))

    def _apply_weights(self) -> None:
        tickets = self.mail.tickets
        while tickets:
            ticket = tickets.popleft()
            if not ticket.abandoned:
                try:
                    with torch.no_grad():
                        target = TensorDict.from_module(self.forward.module)
                        weights = ticket.weights
                        target.update_(weights.to(target.device) if target.device is not None else weights)
                    self.version += 1
                    ticket.version = self.version
                except Exception as exc:  # weights checked on the way in: this would be a device error
                    ticket.error = exc
            self.mail.answer(ticket)

    def _run(self, requests: list[Request]) -> None:
        started = time.monotonic()
        try:
            self.forward(requests, self.version)
        except BaseException as exc:
            for request in requests:  # the callers of this pass get the policy's own error
                if request.route is None:
                    request.error = exc
                    self.mail.answer(request)
            raise
        self.recorder.record(requests, started, time.monotonic())
        for request in requests:
            if request.route is None:
                self.mail.answer(request)
            else:
                self._reply(request)

    def _reply(self, request: Request) -> None:
        sock = self.sock
        if sock is None or request.outputs is None or request.route is None:
            return
        frames = self._encoder.frames(P.REPLY, request.seq, request.version, request.rows, request.outputs)
        # False (not taken) means a client that vanished or stopped reading: a ROUTER drops its answer.
        sock.send_nowait(request.route, frames, copy=P.copy_frames(frames))

    def _answer_all(self, error: BaseException | None) -> None:
        """Answers every request still waiting (with ``error``, or with nothing: the server closed)."""
        for request in [*self.batcher.drain(), *self.mail.inbox]:
            if request.route is None:
                request.error = error
                self.mail.answer(request)
        self.mail.inbox.clear()
        for ticket in self.mail.tickets:
            ticket.error = error
            self.mail.answer(ticket)
        self.mail.tickets.clear()
