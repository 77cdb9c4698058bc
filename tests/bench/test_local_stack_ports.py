"""The ports bench/local_stack.py gives a stack's services: free now, below the kernel's ephemeral range, and never
the same one twice in a process (two services of one stack once drew the same port and one could not listen)."""
import random
import socket

from bench.local_stack import _ephemeral_ports_start, free_port, port_is_free


def test_ports_are_never_handed_out_twice_and_lie_below_the_ephemeral_range():
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= port < _ephemeral_ports_start() for port in ports)


def test_a_port_a_server_listens_on_is_not_free():
    with socket.socket() as server:
        for _ in range(100):  # a port of free_port's range that no one holds, taken by this server
            port = random.randrange(10_000, _ephemeral_ports_start())
            try:
                server.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        server.listen()
        assert not port_is_free(port)
