"""--gateway-processes N: N real gateway processes share the gRPC and HTTP ports (SO_REUSEPORT), every one serves,
/metrics sums all of them whichever answers, a stop reaches every one, and a dead one takes the gateway down."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from bench.local_stack import REPO_ROOT, Stack, free_port, wait_serving
from support.specd_metrics import exposed_series_names

pytestmark = pytest.mark.slow

NUM_REQUESTS = 24


def workers(gateway: subprocess.Popen) -> list[psutil.Process]:
    """The gateway's worker processes (multiprocessing's resource tracker aside)."""
    return [child for child in psutil.Process(gateway.pid).children()
            if "resource_tracker" not in " ".join(child.cmdline())]


@pytest.fixture(scope="module")
def stack():
    stack = Stack(extra_args=("--device", "cpu", "--dtype", "float32", "--gateway-processes", "2",
                              "--log-requests")).start()
    yield stack
    stack.stop_cleanly()


def completion(url: str, index: int) -> dict:
    """One request on a connection of its own (the kernel picks the worker per connection)."""
    with httpx.Client(timeout=120) as client:
        reply = client.post(f"{url}/v1/completions", json={"model": "default", "prompt": f"Count to {index}:",
                                                            "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    reply.raise_for_status()
    return reply.json()


def test_every_process_serves_requests(stack):
    processes = workers(stack.services["gateway"].process)
    assert len(processes) == 2
    # each encodes on its own thread (gateway/tokenizer.py's encode_serially, tests/gateway/test_encode_serially.py)
    assert all(p.environ().get("TOKENIZERS_PARALLELISM") == "false" for p in processes)
    replies = [completion(stack.http_url, i) for i in range(NUM_REQUESTS)]
    assert all(reply["usage"]["completion_tokens"] == 4 for reply in replies)
    # Each worker logs the requests it served under its own pid (--log-requests; its log format names it).
    log = stack.services["gateway"].log_path.read_text()
    served = {p.pid: log.count(f"gateway[{p.pid}] INFO gateway.pipeline: request ") for p in processes}
    assert sum(served.values()) == NUM_REQUESTS and min(served.values()) > 0, served


def test_metrics_sum_every_process_whichever_answers(stack):
    for index in range(NUM_REQUESTS):
        completion(stack.http_url, index)
    counted = set()
    for _ in range(8):  # scrapes on new connections land on either worker
        text = httpx.get(stack.metrics_url("gateway"), timeout=10).text
        line = next(line for line in text.splitlines() if line.startswith('specd_requests_total{finish_reason="length"}'))
        counted.add(float(line.split()[-1]))
        assert exposed_series_names("specd_time_to_first_token_seconds", "histogram") <= {
            line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert len(counted) == 1 and counted.pop() >= NUM_REQUESTS  # the first test's requests are counted too


def start_gateway(http_port: int, grpc_port: int, log=subprocess.PIPE) -> subprocess.Popen:
    """A gateway of two processes with no verifier behind it (it starts, and answers /health with 503); its output
    goes to `log` (a file: nothing then waits for a reader while it runs)."""
    argv = [sys.executable, "-m", "specd_cli", "gateway", "--host", "127.0.0.1", "--port", str(grpc_port),
            "--http-port", str(http_port), "--verifier-addr", f"127.0.0.1:{free_port()}", "--gateway-processes", "2",
            "--drain-seconds", "1"]
    return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def lone_gateway(tmp_path):
    http_port, grpc_port = free_port(), free_port()
    log_path = tmp_path / "gateway.log"
    with open(log_path, "w") as log:
        process = start_gateway(http_port, grpc_port, log)
    wait_serving(f"127.0.0.1:{grpc_port}", process, log_path)
    deadline = time.monotonic() + 60
    while len(workers(process)) < 2 or not all(_listening(p, http_port) for p in workers(process)):
        assert time.monotonic() < deadline, "both workers should listen"
        time.sleep(0.1)
    yield process, http_port, grpc_port, log_path
    if process.poll() is None:
        process.kill()
        process.wait()


def _listening(process: psutil.Process, port: int) -> bool:
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in process.net_connections())


def test_sigterm_stops_every_process_cleanly(lone_gateway):
    process, _, _, _ = lone_gateway
    tree = workers(process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree)


def test_a_dead_process_takes_the_gateway_down_non_zero(lone_gateway):
    process, _, _, log_path = lone_gateway
    first, second = workers(process)
    first.kill()
    assert process.wait(timeout=30) == 1
    assert "exited with code -9; stopping the gateway" in log_path.read_text()
    second.wait(timeout=5)


def test_ports_in_use_fail_before_any_process_starts(lone_gateway):
    _, http_port, grpc_port, _ = lone_gateway
    second = start_gateway(http_port, grpc_port)
    output, _ = second.communicate(timeout=60)
    assert second.returncode == 2
    assert f"cannot listen on 127.0.0.1:{grpc_port}" in output and "--port" in output
