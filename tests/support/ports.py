"""Loopback ports for tests that start `specd up`: whether one is free, and an offset where a stack fits."""
from __future__ import annotations

import random
import socket

STACK_PORTS = (50051, 8000, 50061, 9461, 50071, 9471)  # a one-verifier stack's defaults (docs/PUBLIC_SURFACE.md)


def port_is_free(port: int) -> bool:
    """Whether a server could listen on it now (with SO_REUSEADDR, as every specd server binds: connections
    the server closed itself linger in TIME_WAIT on its port)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_offset() -> int:
    """An offset at which every default port of a one-verifier stack is free."""
    for _ in range(100):
        offset = random.randrange(1000, 9000)
        if all(port_is_free(port + offset) for port in STACK_PORTS):
            return offset
    raise RuntimeError("no free port offset")
