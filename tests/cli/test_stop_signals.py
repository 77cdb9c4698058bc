"""SIGTERM / SIGINT stop `specd up` and each service alone cleanly whenever they land (issue 16, item 1):
while the model loads, once ready, twice in a row. Each case requires exit code 0 within the stop grace,
every process of the tree gone and every port free again. Delays are random (the seed is in the test's
failure message), so repeated runs probe different moments."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.local_stack import REPO_ROOT, free_port
from support.ports import STACK_PORTS, free_offset, port_is_free

pytestmark = pytest.mark.slow

DRAIN_SECONDS = 3.0
# specd up kills what still runs 10 s after the drain (and then exits non-zero); a service alone has as long.
STOP_WITHIN_SECONDS = DRAIN_SECONDS + 10.0 + 10.0
SERVING = health_pb2.HealthCheckResponse.SERVING
SEED = random.randrange(1 << 30)
TERM, INT = signal.SIGTERM, signal.SIGINT


def health(port: int) -> int | None:
    """The service's overall health status; None while nothing answers on the port."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1).status
        except grpc.RpcError:
            return None


def wait_for(condition, process: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"exited early with {process.returncode}"
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def stop_and_check(process: subprocess.Popen, signals: tuple[int, ...], ports: list[int], rng: random.Random) -> None:
    """Sends `signals` (a short random gap between them), then requires a clean, complete stop."""
    children = psutil.Process(process.pid).children(recursive=True)
    tree = [process.pid, *(child.pid for child in children)]
    trackers = {child.pid for child in children if "resource_tracker" in " ".join(child.cmdline())}
    for index, signum in enumerate(signals):
        if index:
            time.sleep(rng.uniform(0.0, 0.3))
        process.send_signal(signum)
    try:
        code = process.wait(timeout=STOP_WITHIN_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_WITHIN_SECONDS} s after {signals} (seed {SEED})")
    assert code == 0, f"exit code {code} after {signals} (seed {SEED})"
    alive = [pid for pid in tree if _alive(pid)]
    # multiprocessing's resource tracker (started with the spawned workers) exits once it reads the end of its
    # pipe, which the parent's exit closes: a moment after the parent, not before it.
    deadline = time.monotonic() + 5.0
    while alive and all(pid in trackers for pid in alive) and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if _alive(pid)]
    assert not alive, f"still alive after the stop: {alive} (seed {SEED})"
    busy = [port for port in ports if not port_is_free(port)]
    assert not busy, f"ports still bound: {busy} (seed {SEED})"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def service(command: str, *args: str) -> tuple[subprocess.Popen, list[int]]:
    ports = [free_port(), free_port()]
    port_flag = "--http-port" if command == "gateway" else "--metrics-port"
    argv = [sys.executable, "-m", "specd_cli", command, "--host", "127.0.0.1", "--device", "cpu",
            "--port", str(ports[0]), port_flag, str(ports[1]), "--drain-seconds", str(DRAIN_SECONDS), *args]
    if command == "gateway":
        argv += ["--verifier-addr", f"127.0.0.1:{free_port()}"]
    return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), ports


@pytest.mark.parametrize("moment, signals", [
    ("loading", (TERM,)),
    ("loading", (INT, INT)),
    ("ready", (INT, TERM)),
])
def test_specd_up_stops_cleanly(moment, signals):
    rng = random.Random(f"{SEED}-up-{moment}-{signals}")
    offset = free_offset()
    argv = [sys.executable, "-m", "specd_cli", "up", "--port-offset", str(offset), "--host", "127.0.0.1",
            "--device", "cpu", "--drain-seconds", str(DRAIN_SECONDS)]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if moment == "loading":  # the services are starting: some listen, the verifier loads its model
            wait_for(lambda: len(psutil.Process(process.pid).children()) == 3, process)
            time.sleep(rng.uniform(0.0, 2.0))
        else:
            assert process.stdout.readline() == "specd: ready\n"  # once every service reports SERVING
            assert len(psutil.Process(process.pid).children()) == 3
            time.sleep(rng.uniform(0.0, 0.5))
        stop_and_check(process, signals, [port + offset for port in STACK_PORTS], rng)
        assert process.stdout.read() in ("", "specd: ready\n")  # never anything but the one ready line
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("command, moment, signals", [
    ("verifier", "loading", (TERM,)),
    ("verifier", "ready", (TERM, INT)),
    ("drafter", "ready", (INT,)),
    ("gateway", "ready", (TERM, TERM)),
])
def test_a_service_alone_stops_cleanly(command, moment, signals):
    rng = random.Random(f"{SEED}-{command}-{moment}-{signals}")
    process, ports = service(command, "--drafter-addr", "none") if command == "verifier" else service(command)
    try:
        if moment == "loading":  # the port is open (health NOT_SERVING) while the model loads
            wait_for(lambda: health(ports[0]) is not None, process)
            time.sleep(rng.uniform(0.0, 1.0))
        else:
            wait_for(lambda: health(ports[0]) == SERVING, process)
        stop_and_check(process, signals, ports, rng)
    finally:
        if process.poll() is None:
            process.kill()
