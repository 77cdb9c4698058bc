"""A whole specd stack as real processes on free loopback ports, one process per service, for the soak
benchmark (bench/soak.py) and the end-to-end tests.

Each service runs as `python -m specd_cli <service> ...` with its output in a log file; `start()`
returns once every service's grpc health check reports SERVING. One service can be killed and
restarted on the same ports (the soak and the drafter-failure tests do). Model loading costs seconds on
the CPU, so tests share one stack per module.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from specd import environment
from specd.serving import TlsConfig, open_channel

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_SECONDS = 240.0
_LOWEST_PORT = 10_000  # free_port's ports lie in [this, the kernel's first ephemeral port)


_handed_out: set[int] = set()  # free_port's ports so far: a stack's services are only started after all are chosen


def free_port() -> int:
    """A loopback TCP port nothing listens on now, below the kernel's range of ephemeral ports, and never one it
    returned before in this process (two services of one stack drew the same port: "cannot listen on ... (in use?)").

    Binding port 0 would hand out an ephemeral port, which any connection opened before the server binds it may
    take as its own local port (a CI run lost a stack fixture to that: "cannot listen on 127.0.0.1:58591"). No
    connection is given a port below that range, so only another server could take this one."""
    low = _ephemeral_ports_start()
    for _ in range(200):
        port = random.randrange(_LOWEST_PORT, low)
        if port not in _handed_out and port_is_free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in [{_LOWEST_PORT}, {low})")


def _ephemeral_ports_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return max(low, _LOWEST_PORT + 1000)


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


def wait_serving(address: str, process: subprocess.Popen, log_path: Path,
                 timeout: float = START_TIMEOUT_SECONDS, tls: TlsConfig | None = None) -> None:
    """Blocks until `address` reports SERVING; raises with the log's tail if the process dies first.

    `tls`: how to reach a service started with TLS (the CA, and a client certificate for mTLS)."""
    deadline = time.monotonic() + timeout
    with open_channel(address, tls, asynchronous=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{address} exited with {process.returncode}:\n{_tail(log_path)}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{address} not SERVING after {timeout:.0f} s:\n{_tail(log_path)}")


def metric_value(url: str, name: str, **labels) -> float:
    """The summed value of the samples named `name` whose labels include `labels` (0 if absent)."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _ssl_context(verify, cert):
    """httpx's verify argument: True (system roots) or an SSL context with the CA and a client certificate."""
    if verify is True:
        return True
    context = ssl.create_default_context(cafile=verify)
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int
    metrics_port: int
    log_path: Path
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def launch(self, env: dict[str, str]) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Sends `sig` and waits; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@dataclass
class Stack:
    """drafter + N verifiers + gateway; `extra_args` go to every service (e.g. ["--num-speculative-tokens", "0"])."""

    num_verifiers: int = 1
    with_drafter: bool = True  # False: verifiers run with --drafter-addr none
    extra_args: tuple[str, ...] = ("--device", "cpu", "--dtype", "float32")
    client_tls: TlsConfig | None = None  # for health checks when extra_args turn TLS on
    services: dict[str, Service] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="specd-stack-")))

    def __post_init__(self) -> None:
        drafter_addr = self._service("drafter", []).address if self.with_drafter else "none"
        verifiers = [self._service(f"verifier-{i}", ["--drafter-addr", drafter_addr])
                     for i in range(self.num_verifiers)]
        gateway_args = ["--http-port", str(free_port())]
        for verifier in verifiers:
            gateway_args += ["--verifier-addr", verifier.address]
        self._service("gateway", gateway_args)
        self.http_port = int(gateway_args[1])

    def _service(self, name: str, args: list[str]) -> Service:
        port, metrics_port = free_port(), free_port()
        command = name.split("-")[0]
        argv = [sys.executable, "-m", "specd_cli", command, "--host", "127.0.0.1", "--port", str(port),
                "--metrics-port", str(metrics_port), *self.extra_args, *args]
        service = Service(name, argv, port, metrics_port, self.log_dir / f"{name}.log")
        self.services[name] = service
        return service

    @property
    def env(self) -> dict[str, str]:
        kept = (environment.HOME, environment.DEFAULT_GGUF)  # where the model is, not how the services run
        env = {k: v for k, v in os.environ.items() if not k.startswith(environment.PREFIX) or k in kept}
        inherited = os.environ.get("PYTHONPATH")  # packages kept in a folder of their own, as on the GPU machine
        env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{inherited}" if inherited else str(REPO_ROOT)
        env.setdefault("OMP_NUM_THREADS", "2")
        return env

    @property
    def gateway_address(self) -> str:
        return self.services["gateway"].address

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def verifier_addresses(self) -> list[str]:
        return [s.address for name, s in self.services.items() if name.startswith("verifier")]

    def metrics_url(self, name: str) -> str:
        """Prometheus endpoint of a service (the gateway serves /metrics on its HTTP port)."""
        port = self.http_port if name == "gateway" else self.services[name].metrics_port
        return f"http://127.0.0.1:{port}/metrics"

    def start(self) -> "Stack":
        """Launches every service at once (the drafter is quick, verifiers load the model) and waits
        until each reports SERVING and the gateway routes to every verifier."""
        for service in self.services.values():
            service.launch(self.env)
        try:
            for service in self.services.values():
                wait_serving(service.address, service.process, service.log_path, tls=self.client_tls)
            self.wait_routed()
        except Exception:
            self.stop()
            raise
        return self

    def wait_routed(self, timeout: float = 30.0) -> None:
        """Blocks until the gateway's /health lists every verifier as healthy.

        A verifier that has just become SERVING gets traffic only after the gateway's next health
        poll; tests that expect load on every replica wait for that here."""
        verify, cert, scheme = True, None, "http"
        if self.client_tls is not None:
            verify, scheme = self.client_tls.ca_path or True, "https"
            cert = (self.client_tls.cert_path, self.client_tls.key_path) if self.client_tls.cert_path else None
        url = f"{scheme}://127.0.0.1:{self.http_port}/health"
        deadline = time.monotonic() + timeout
        with httpx.Client(verify=_ssl_context(verify, cert)) as client:
            while True:
                states = client.get(url, timeout=5).json().get("verifiers", {})
                if states and all(state == "healthy" for state in states.values()):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gateway does not route to every verifier: {states}")
                time.sleep(0.05)

    def kill(self, name: str) -> None:
        """SIGKILL one service (no drain), as a crash would."""
        self.services[name].stop(signal.SIGKILL)

    def restart(self, name: str) -> None:
        """Starts a stopped service again on its old ports and waits for SERVING."""
        service = self.services[name]
        service.launch(self.env)
        wait_serving(service.address, service.process, service.log_path, tls=self.client_tls)
        gateway = self.services["gateway"].process
        if name != "drafter" and gateway is not None and gateway.poll() is None:
            self.wait_routed()

    def stop(self) -> dict[str, int]:
        """SIGTERM to gateway, verifiers, drafter in that order; returns each exit code."""
        return {name: service.stop() for name, service in reversed(list(self.services.items()))}

    def stop_cleanly(self) -> None:
        """stop(), then fail (with the logs) unless every service exited 0: an unclean stop is a bug."""
        exit_codes = self.stop()
        assert all(code == 0 for code in exit_codes.values()), f"unclean stop {exit_codes}\n{self.logs()}"

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{_tail(s.log_path)}" for name, s in self.services.items())
