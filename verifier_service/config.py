"""The verifier's one frozen config, built once at start-up from the shared CLI options."""
from __future__ import annotations

from dataclasses import dataclass, field

from drafter_service.config import DrafterConfig, drafter_config_from_options
from specd.options import (DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, IN_PROCESS_DRAFTER, VERIFIER_PORTS,
                           ServiceOptions, drain)
from specd.serving import ServerConfig, TlsConfig
from verifier_service.attention import FLASH_BLOCK_SIZE_MULTIPLE as FLASH_BLOCK_SIZE
from verifier_service.engine.config import EngineConfig


@dataclass(frozen=True)
class VerifierConfig:
    """Everything `verifier_service.server.serve` needs: the engine's config plus the service around it."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    drafter_addr: str | None = "127.0.0.1:50071"  # None = decode without a drafter (or with in_process_drafter)
    drafter_tls: TlsConfig | None = None
    in_process_drafter: DrafterConfig | None = None  # the drafter's rule in the engine process instead of a service
    max_waiting_requests: int = 256  # beyond this, Generate answers RESOURCE_EXHAUSTED
    serve_port: int = 0  # the Serve socket's (serve_socket.py); 0: a free port, which the load reports name
    server: ServerConfig = field(
        default_factory=lambda: ServerConfig(port=VERIFIER_PORTS[0], metrics_port=VERIFIER_PORTS[1]))

    def __post_init__(self) -> None:
        if self.max_waiting_requests < 1:
            raise ValueError("max_waiting_requests: must be >= 1")


def verifier_config_from_options(options: ServiceOptions) -> VerifierConfig:
    """The verifier's config from `specd verifier` options (ports default to docs/PUBLIC_SURFACE.md's)."""
    tls = TlsConfig(options.tls_cert, options.tls_key, options.tls_ca) if options.tls_cert else None
    # The drafter is dialled with the same CA and client certificate this server presents.
    drafter_tls = TlsConfig(options.tls_cert, options.tls_key, options.tls_ca) if options.tls_cert else None
    server = ServerConfig(
        host=options.host,
        port=VERIFIER_PORTS[0] if options.port is None else options.port,
        metrics_port=VERIFIER_PORTS[1] if options.metrics_port is None else options.metrics_port,
        tls=tls,
        **drain(options),
    )
    device = options.resolved_device()
    engine = EngineConfig(
        max_num_seqs=options.max_num_seqs or DEFAULT_MAX_NUM_SEQS[device],
        max_num_batched_tokens=options.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS[device],
        model=options.model, device=device, dtype=options.resolved_dtype(),
        num_speculative_tokens=options.resolved_num_speculative_tokens(),
        max_speculative_tokens=options.max_speculative_tokens,
        max_model_len=options.max_model_len,
        draft_goodput=options.draft_policy == "goodput",
        async_scheduling={"auto": None, "on": True, "off": False}[options.async_scheduling],
        tensor_parallel_size=options.tensor_parallel_size,
        deterministic=options.deterministic,
        **_cache_layout(device, options.kv_cache_bytes, options.kv_cache_memory_fraction),
    )
    # --drafter-addr none (or empty) runs the verifier without a drafter: plain decoding; in-process drafts in the
    # engine process (no round trip; its memory of outputs is this verifier's own).
    in_process = options.drafter_addr.lower() == IN_PROCESS_DRAFTER
    drafter_addr = None if in_process or options.drafter_addr.lower() in ("", "none") else options.drafter_addr
    return VerifierConfig(engine=engine, drafter_addr=drafter_addr, drafter_tls=drafter_tls, server=server,
                          max_waiting_requests=options.max_waiting_requests, serve_port=options.serve_port,
                          in_process_drafter=drafter_config_from_options(options) if in_process else None)


def _cache_layout(device: str, kv_cache_bytes: int | None, memory_fraction: float | None) -> dict:
    """EngineConfig's KV settings for the device. On CUDA: blocks of 256 tokens (flash-attn's paged layout
    needs a multiple of 256; with 16 the verifier falls back to the reference backend and no CUDA graphs)
    and, unless --kv-cache-bytes says otherwise, a cache sized from free GPU memory (0)."""
    layout = {"block_size": FLASH_BLOCK_SIZE, "kv_cache_bytes": 0} if device == "cuda" else {}
    if kv_cache_bytes is not None:
        layout["kv_cache_bytes"] = kv_cache_bytes
    if memory_fraction is not None:
        layout["kv_cache_memory_fraction"] = memory_fraction
    return layout
