"""Loopback ports for tests that start `specd up`: an offset where a whole stack fits."""
from __future__ import annotations

import random

from bench.local_stack import port_is_free

STACK_PORTS = (50051, 8000, 50061, 9461, 50071, 9471)  # a one-verifier stack's defaults (docs/PUBLIC_SURFACE.md)


def free_offset() -> int:
    """An offset at which every default port of a one-verifier stack is free."""
    for _ in range(100):
        offset = random.randrange(1000, 9000)
        if all(port_is_free(port + offset) for port in STACK_PORTS):
            return offset
    raise RuntimeError("no free port offset")
