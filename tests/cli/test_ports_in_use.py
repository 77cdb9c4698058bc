"""A port that is taken stops a service at once with one line naming the service, the port and the option
that moves it, and exit code 2; `specd up` names the service and stops the rest (issue 16, item 3)."""
from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest

from bench.local_stack import REPO_ROOT, free_port, wait_serving
from support.ports import STACK_PORTS, free_offset, port_is_free

PORT_OPTIONS = {"drafter": ("--port", "--metrics-port"), "verifier": ("--port", "--metrics-port"),
                "gateway": ("--port", "--http-port")}


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def service_argv(command: str, **ports: int) -> list[str]:
    argv = [sys.executable, "-m", "specd_cli", command, "--host", "127.0.0.1", "--device", "cpu"]
    for option in PORT_OPTIONS[command]:
        argv += [option, str(ports.get(option, free_port()))]
    return argv


def assert_one_line_naming(stderr: str, command: str, port: int, option: str) -> None:
    assert "Traceback" not in stderr and "never awaited" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"specd {command}: cannot listen on 127.0.0.1:{port}"), stderr
    assert option in line and "SPECD_" in line, line


@pytest.mark.parametrize("command, option", [  # one per way of binding: gRPC, /metrics, the gateway's HTTP
    ("drafter", "--port"), ("drafter", "--metrics-port"), ("gateway", "--http-port"), ("verifier", "--metrics-port")])
def test_a_taken_port_is_one_line_and_exit_code_2(command, option, taken_port):
    result = subprocess.run(service_argv(command, **{option: taken_port}), cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert_one_line_naming(result.stderr, command, taken_port, option)


def test_a_grpc_port_another_specd_server_holds_is_refused_not_shared():
    """gRPC servers share a port by default (SO_REUSEPORT): two drafters would split one port's traffic."""
    port = free_port()
    first = subprocess.Popen(service_argv("drafter", **{"--port": port}), cwd=REPO_ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_serving(f"127.0.0.1:{port}", first, REPO_ROOT / "none.log")
        second = subprocess.run(service_argv("drafter", **{"--port": port}), cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 2
        assert_one_line_naming(second.stderr, "drafter", port, "--port")
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_specd_up_names_the_service_whose_port_is_taken_and_stops_the_rest():
    offset = free_offset()
    taken = 9471 + offset  # the drafter's /metrics
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", taken))
        sock.listen()
        argv = [sys.executable, "-m", "specd_cli", "up", "--port-offset", str(offset), "--host", "127.0.0.1",
                "--device", "cpu"]
        process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        children = psutil.Process(process.pid).children()
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert "specd: ready" not in stdout
    assert f"specd drafter: cannot listen on 127.0.0.1:{taken}" in stderr and "--metrics-port" in stderr
    assert "specd: drafter exited with code 2; stopping the stack" in stderr
    assert "Traceback" not in stderr
    _gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive
    assert all(port_is_free(port + offset) for port in STACK_PORTS)
