"""dflash_ops.loopback: a free port binds; a server that does not answer is named."""

from __future__ import annotations

import socket

import pytest
from dflash_ops.errors import UserError
from dflash_ops.loopback import free_port, start_server


def test_free_port_can_be_bound() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def test_free_ports_are_below_the_kernels_ephemeral_range() -> None:
    """An engine's own sockets (ports the kernel picks) can never take a port picked for a
    server that starts after it."""
    from dflash_ops.loopback import _ephemeral_low

    low = _ephemeral_low()
    if low <= 16000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}: nothing below it to pick")
    ports = {free_port() for _ in range(50)}
    assert all(15000 <= port < low for port in ports), sorted(ports)
    assert len(ports) > 40  # picked at random, not one port over and over


def test_a_server_that_exits_is_named() -> None:
    # `python -m json.tool --port N` exits at once with a usage error: it never answers /health.
    with pytest.raises(UserError, match=r"json\.tool did not start: no answer on http://127"):
        start_server("json.tool")


def test_a_server_still_starting_at_the_deadline_is_named() -> None:
    # The instant server needs longer than no time at all to import and listen.
    with pytest.raises(UserError, match=r"dflash_ops\.bench\.fake_server did not start"):
        start_server("dflash_ops.bench.fake_server", timeout_s=0)


def test_ports_in_a_row_can_all_be_bound() -> None:
    import socket

    from dflash_ops.loopback import free_ports_in_a_row

    base = free_ports_in_a_row(3)
    sockets = [socket.socket() for _ in range(3)]
    try:
        for i, sock in enumerate(sockets):
            sock.bind(("127.0.0.1", base + i))
    finally:
        for sock in sockets:
            sock.close()
