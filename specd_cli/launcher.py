"""`specd up`: the whole stack as separate processes, supervised until SIGTERM / SIGINT.

Every service is started as `python -m specd_cli <service> ...` in its own session (so a terminal's
Ctrl-C reaches only this supervisor, which then stops the services in order: gateway, verifiers,
drafter). `specd: ready` is printed once every service's grpc health check reports SERVING. When a
service dies, the others are stopped and the supervisor exits non-zero.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specd import stop_signals
from specd.options import DRAFTER_PORTS, GATEWAY_PORTS, IN_PROCESS_DRAFTER, VERIFIER_PORTS, ServiceOptions
from specd.serving import TlsConfig, open_channel

MAX_VERIFIERS = DRAFTER_PORTS[0] - VERIFIER_PORTS[0]  # replicas take consecutive ports below the drafter's
DEFAULT_DRAIN_SECONDS = 10.0  # the gateway's and the verifier's own default (the drafter's is shorter)
STOP_MARGIN_SECONDS = 10.0  # after a service's drain: closing its engine and channels, the process exit


@dataclass
class ServiceProcess:
    name: str
    argv: list[str]
    grpc_port: int
    process: subprocess.Popen | None = None


def plan_stack(options: ServiceOptions, num_verifiers: int, port_offset: int) -> list[ServiceProcess]:
    """The processes of one stack: drafter, verifier replicas, gateway, on the default ports + offset."""
    if not 1 <= num_verifiers <= MAX_VERIFIERS:
        raise ValueError(f"num_verifiers: must be in 1..{MAX_VERIFIERS}, got {num_verifiers}")
    loopback = "127.0.0.1"
    drafter_port = DRAFTER_PORTS[0] + port_offset
    in_process = options.drafter_addr.lower() == IN_PROCESS_DRAFTER  # each verifier drafts itself: no drafter
    drafter_addr = IN_PROCESS_DRAFTER if in_process else f"{loopback}:{drafter_port}"
    services = [] if in_process else [
        ServiceProcess("drafter", _argv("drafter", options, drafter_port, DRAFTER_PORTS[1] + port_offset),
                       drafter_port)]
    verifier_addrs = []
    for replica in range(num_verifiers):
        port = VERIFIER_PORTS[0] + port_offset + replica
        argv = _argv("verifier", options, port, VERIFIER_PORTS[1] + port_offset + replica)
        argv += ["--drafter-addr", drafter_addr,
                 "--tensor-parallel-size", str(options.tensor_parallel_size)]
        services.append(ServiceProcess(f"verifier-{replica}" if num_verifiers > 1 else "verifier", argv, port))
        verifier_addrs += ["--verifier-addr", f"{loopback}:{port}"]
    gateway_port = GATEWAY_PORTS[0] + port_offset
    argv = _argv("gateway", options, gateway_port, None) + ["--http-port", str(GATEWAY_PORTS[1] + port_offset),
                                                            "--gateway-processes", str(_gateway_processes(options)),
                                                            "--stream-interval", str(options.stream_interval),
                                                            "--verifier-transport", options.verifier_transport]
    services.append(ServiceProcess("gateway", argv + verifier_addrs, gateway_port))
    return services


def _gateway_processes(options: ServiceOptions) -> int:
    """On one machine the verifier's engine, its service layer and the drafter need cores too: one gateway
    process per 4 usable CPUs unless --gateway-processes says otherwise."""
    return options.resolved_gateway_processes(cpus_per_process=4)


def _argv(service: str, options: ServiceOptions, port: int, metrics_port: int | None) -> list[str]:
    argv = [sys.executable, "-m", "specd_cli", service, "--port", str(port), "--host", options.host,
            "--model", options.model, "--device", options.device, "--dtype", options.dtype,
            "--max-model-len", str(options.max_model_len)]
    if options.num_speculative_tokens is not None:  # unset: each verifier takes its device's default
        argv += ["--num-speculative-tokens", str(options.num_speculative_tokens)]
    if options.max_speculative_tokens is not None:
        argv += ["--max-speculative-tokens", str(options.max_speculative_tokens)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    for flag, value in (("--tls-cert", options.tls_cert), ("--tls-key", options.tls_key),
                        ("--tls-ca", options.tls_ca), ("--api-key", options.api_key)):
        if value:
            argv += [flag, value]
    for flag, count in (("--max-num-seqs", options.max_num_seqs),
                        ("--max-num-batched-tokens", options.max_num_batched_tokens)):
        if count is not None:
            argv += [flag, str(count)]
    if options.kv_cache_bytes is not None:
        argv += ["--kv-cache-bytes", str(options.kv_cache_bytes)]
    if options.kv_cache_memory_fraction is not None:
        argv += ["--kv-cache-memory-fraction", str(options.kv_cache_memory_fraction)]
    argv += ["--max-waiting-requests", str(options.max_waiting_requests),
             "--draft-memory-scope", options.draft_memory_scope, "--drafting", options.drafting,
             "--draft-policy", options.draft_policy, "--async-scheduling", options.async_scheduling]
    for flag, number in (("--draft-memory-tokens", options.draft_memory_tokens),
                         ("--draft-min-probability", options.draft_min_probability)):
        if number is not None:
            argv += [flag, str(number)]
    if options.drain_seconds is not None:
        argv += ["--drain-seconds", str(options.drain_seconds)]
    if options.log_requests:
        argv.append("--log-requests")
    if options.deterministic:
        argv.append("--deterministic")
    return argv


def _die_with_parent() -> None:
    """Runs in the child before exec: a SIGKILLed supervisor must not leave services behind."""
    stop_signals.die_with_parent(signal.SIGTERM)


class StackSupervisor:
    """Starts the planned services, reports readiness, and stops them all on a signal or a death."""

    def __init__(self, services: list[ServiceProcess], tls: TlsConfig | None = None,
                 drain_seconds: float | None = None) -> None:
        """`drain_seconds`: the services' --drain-seconds (None: their default); a service still running
        STOP_MARGIN_SECONDS after it is killed."""
        self._services = services
        self._tls = tls
        self._stop_grace_seconds = (DEFAULT_DRAIN_SECONDS if drain_seconds is None else drain_seconds) + \
            STOP_MARGIN_SECONDS

    def run(self) -> int:
        """Blocks until stopped; returns the process exit code (0 after a clean SIGTERM / SIGINT)."""
        stop_signals.install()  # a handler that only records: see specd/stop_signals.py
        for service in self._services:
            service.process = subprocess.Popen(service.argv, start_new_session=True, preexec_fn=_die_with_parent)
        code = 1
        try:
            code = self._supervise()
        finally:
            exit_codes = self._stop_all()
        # A service that dies of SIGTERM itself was stopped before it set up its handlers: it held nothing yet.
        unclean = {name: rc for name, rc in exit_codes.items() if rc not in (0, -signal.SIGTERM)}
        if code == 0 and unclean:
            print(f"specd: unclean stop: {unclean}", file=sys.stderr, flush=True)
            return 1
        return code

    def _supervise(self) -> int:
        pending = {service.name for service in self._services}
        while not stop_signals.requested():
            dead = self._first_dead()
            if dead is not None:
                code = dead.process.returncode
                print(f"specd: {dead.name} exited with code {code}; stopping the stack", file=sys.stderr, flush=True)
                return code if code > 0 else 1  # 2: a setting it cannot start with (its own line says which)
            if pending:
                pending = {s.name for s in self._services if s.name in pending and not self._serving(s)}
                if not pending:
                    print("specd: ready", flush=True)
            time.sleep(0.2)  # a stop signal is noticed within this (plus a health check's 1 s at most)
        return 0

    def _first_dead(self) -> ServiceProcess | None:
        return next((s for s in self._services if s.process.poll() is not None), None)

    def _serving(self, service: ServiceProcess) -> bool:
        with open_channel(f"127.0.0.1:{service.grpc_port}", self._tls, asynchronous=False) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _stop_all(self) -> dict[str, int]:
        """SIGTERM in front-to-back order (the gateway drains first), then wait, then SIGKILL stragglers.

        Returns each service's exit code."""
        for service in reversed(self._services):
            if service.process and service.process.poll() is None:
                service.process.terminate()
        deadline = time.monotonic() + self._stop_grace_seconds
        for service in reversed(self._services):
            if service.process is None:
                continue
            try:
                service.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait()
        return {s.name: s.process.returncode for s in self._services if s.process is not None}
