"""The server thread's ROUTER socket: binding, the private ipc directory, errors at the boundary."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from acollect._runtime.server_socket import ServerSocket, Waiter
from acollect._runtime.worker_socket import WorkerSocket
from acollect.errors import ConfigurationError, TransportError


def test_a_private_ipc_path_is_removed_on_close() -> None:
    server = ServerSocket("ipc")
    path = Path(server.address.removeprefix("ipc://"))
    assert path.exists()
    server.close()
    assert not path.parent.exists()
    server.close()  # idempotent
    assert server.closed


def test_an_address_in_use_is_a_configuration_error_naming_it() -> None:
    with ServerSocket("tcp://127.0.0.1") as first:
        with pytest.raises(ConfigurationError, match=r"address.*can bind"):
            ServerSocket(first.address)


def test_a_malformed_address_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="address"):
        ServerSocket("udp://127.0.0.1:5")


def test_a_closed_socket_raises_transport_errors() -> None:
    server = ServerSocket("tcp://127.0.0.1")
    server.close()
    with pytest.raises(TransportError, match="closed"):
        server.recv_nowait()
    with pytest.raises(TransportError, match="closed"):
        server.send_nowait(b"w0", [b"x"], copy=True)


def test_the_waiter_wakes_on_a_descriptor_or_a_request_and_times_out_otherwise() -> None:
    wake_r, wake_w = socket.socketpair()
    with ServerSocket("tcp://127.0.0.1") as server, WorkerSocket(server.address, b"w0") as client:
        waiter = Waiter([wake_r.fileno()], server)
        assert not waiter.wait(20)
        assert server.recv_nowait() is None
        threading.Timer(0.05, wake_w.send, (b"\0",)).start()
        ready = waiter.wait(5000)
        assert ready.fds == {wake_r.fileno()}  # what woke it, and only that
        assert not ready.socket
        wake_r.recv(1)
        client.send([b"ask"], timeout=5)
        ready = waiter.wait(5000)
        assert ready.socket
        assert not ready.fds
        route, frames = server.recv_nowait() or (b"", [])
        assert (route, [bytes(f) for f in frames]) == (b"w0", [b"ask"])
        # An answer to a client that is not there is dropped by the ROUTER, never raised.
        assert server.send_nowait(b"nobody", [b"x"], copy=True)
    wake_r.close()
    wake_w.close()
