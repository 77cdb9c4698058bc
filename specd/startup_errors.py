"""Settings a service cannot start with: `specd <service>` prints the error as one line and exits with code 2."""
from __future__ import annotations

import socket


class StartupError(Exception):
    """A setting, or the machine, stops this service from starting; the message says which setting fixes it."""


class PortInUse(StartupError):
    """A port the service must listen on is taken (or cannot be bound on that host)."""

    def __init__(self, host: str, port: int, option: str) -> None:
        env = "SPECD_" + option.upper().replace("-", "_")
        super().__init__(f"cannot listen on {host}:{port} (in use?); choose another port with --{option} / {env}, "
                         f"or --port-offset under specd up")
        self.port = port


def bound_socket(host: str, port: int, option: str, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to host:port as servers bind (SO_REUSEADDR), not listening yet; PortInUse naming
    `option` (the CLI option that sets the port) when the port is taken. With `reuse_port`, sockets of this
    user's other processes that set it too may share the port (gateway/processes.py).

    The protocol is named (IPPROTO_TCP, not the default 0) because asyncio turns Nagle's algorithm off only on
    connections whose socket says TCP: on one that said 0, a streamed response's small writes waited for the
    client's delayed ACK, about 40 ms, once a keep-alive connection had left the kernel's quick-ACK start (every
    SDK client's second request on)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise PortInUse(host, port, option) from error
    return sock
