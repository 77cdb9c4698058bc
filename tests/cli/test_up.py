"""`specd up`: the whole stack as separate processes, `specd: ready` once all are SERVING, clean stop."""
import random
import signal
import socket
import subprocess
import sys

import psutil
import pytest

from support.stack import REPO_ROOT

PORTS = (50051, 8000, 50061, 9461, 50071, 9471)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_offset() -> int:
    """An offset at which every default port of a one-verifier stack is free."""
    for _ in range(100):
        offset = random.randrange(1000, 9000)
        if all(port_is_free(port + offset) for port in PORTS):
            return offset
    raise RuntimeError("no free port offset")


@pytest.fixture(scope="module")
def stack_process():
    argv = [sys.executable, "-m", "specd.cli", "up", "--port-offset", str(free_offset()), "--host", "127.0.0.1",
            "--device", "cpu"]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_up_prints_ready_once_every_service_serves(stack_process):
    line = stack_process.stdout.readline()  # blocks until the supervisor says so (or exits)
    assert line == "specd: ready\n"
    children = psutil.Process(stack_process.pid).children()
    assert len(children) == 3 and all(child.is_running() for child in children)


def test_sigterm_stops_every_service_cleanly(stack_process):
    children = psutil.Process(stack_process.pid).children()
    stack_process.send_signal(signal.SIGTERM)
    assert stack_process.wait(timeout=60) == 0
    assert stack_process.stdout.read() == ""  # nothing after the one ready line
    # The supervisor exits 0 only when every service exited 0 after its drain.
    _gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive


def test_a_service_that_dies_at_start_up_stops_the_stack():
    argv = [sys.executable, "-m", "specd.cli", "up", "--port-offset", str(free_offset()), "--host", "127.0.0.1",
            "--model", "/nonexistent/model"]
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "specd: ready" not in result.stdout
    assert "exited with code" in result.stderr
