"""The gateway's configuration: one frozen dataclass, validated once at start-up."""
from __future__ import annotations

from dataclasses import dataclass

from specd.options import MAX_STREAM_INTERVAL, VERIFIER_TRANSPORTS
from specd.serving import TlsConfig


def _valid_address(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) <= 65535


@dataclass(frozen=True)
class GatewayConfig:
    """Where the gateway listens, which verifiers it routes to, and how it guards itself."""

    model_path: str  # a Hugging Face checkpoint folder (resolved; "default" is mapped by the CLI)
    verifier_addrs: tuple[str, ...] = ("127.0.0.1:50061",)
    host: str = "0.0.0.0"
    grpc_port: int = 50051  # 0 = any free port (tests)
    http_port: int = 8000  # 0 = any free port (tests)
    api_key: str | None = None  # when set, clients send `authorization: Bearer <key>`
    tls: TlsConfig | None = None  # server certificate for gRPC and HTTPS; also used towards verifiers
    max_model_len: int | None = None  # context length until a verifier reports its own; None = config.json
    request_timeout_seconds: float | None = None  # default deadline of HTTP requests (gRPC brings its own)
    health_poll_seconds: float = 0.5  # how often verifier health and load are polled
    grace_seconds: float = 10.0  # how long in-flight requests may run on after SIGTERM
    log_requests: bool = False  # log prompts and outputs; off, they never reach the logs
    processes: int = 1  # gateway processes sharing both ports (gateway/processes.py)
    stream_interval: int = 1  # tokens a stream gathers per event after its first (verifier_stream.Updates)
    verifier_transport: str = "socket"  # the Serve stream over a verifier's Serve socket where it has one, or "grpc"
    reuse_port: bool = False  # set by gateway/processes.py for its workers: bind the ports with SO_REUSEPORT

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("model_path: required")
        if not self.verifier_addrs:
            raise ValueError("verifier_addrs: at least one verifier address is needed")
        for address in self.verifier_addrs:
            if not _valid_address(address):
                raise ValueError(f"verifier_addrs: {address!r} is not HOST:PORT")
        for name in ("grpc_port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name}: {getattr(self, name)} is not a TCP port")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key: must not be empty (leave it unset to turn the check off)")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len: must be >= 2")
        if self.request_timeout_seconds is not None and self.request_timeout_seconds <= 0:
            raise ValueError("request_timeout_seconds: must be > 0")
        if self.health_poll_seconds <= 0:
            raise ValueError("health_poll_seconds: must be > 0")
        if self.processes < 1:
            raise ValueError(f"processes: must be >= 1, got {self.processes}")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(f"stream_interval: must be in 1..{MAX_STREAM_INTERVAL}, got {self.stream_interval}")
        if self.verifier_transport not in VERIFIER_TRANSPORTS:
            raise ValueError(f"verifier_transport: must be one of {', '.join(VERIFIER_TRANSPORTS)}, "
                             f"got {self.verifier_transport!r}")
        if self.processes > 1 and not (self.grpc_port and self.http_port):
            raise ValueError("processes: several gateway processes need fixed ports (not 0)")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds: must be >= 0")
