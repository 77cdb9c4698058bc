"""Maps the shared CLI options onto the gateway's and the drafter's frozen configs.

(The verifier's lives beside its config: verifier_service/config.py.) Ports left unset take the
defaults of docs/PUBLIC_SURFACE.md.
"""
from __future__ import annotations

from specd.default_model import resolve_model_path
from specd.options import DRAFTER_PORTS, GATEWAY_PORTS, ServiceOptions, drain
from specd.serving import TlsConfig


def _tls(options: ServiceOptions) -> TlsConfig | None:
    return TlsConfig(options.tls_cert, options.tls_key, options.tls_ca) if options.tls_cert else None


def gateway_config_from_options(options: ServiceOptions):
    """The gateway needs the model folder only for its tokenizer and chat template."""
    from gateway.config import GatewayConfig

    return GatewayConfig(
        model_path=str(resolve_model_path(options.model)),
        verifier_addrs=options.verifier_addresses,
        host=options.host,
        grpc_port=GATEWAY_PORTS[0] if options.port is None else options.port,
        http_port=GATEWAY_PORTS[1] if options.http_port is None else options.http_port,
        api_key=options.api_key,
        tls=_tls(options),
        max_model_len=options.max_model_len or None,
        log_requests=options.log_requests,
        processes=options.resolved_gateway_processes(),
        **drain(options),
    )


def drafter_config_from_options(options: ServiceOptions):
    """The drafter holds no model: where it listens, and what its memory keeps."""
    from drafter_service.config import DrafterConfig

    defaults = DrafterConfig()
    return DrafterConfig(
        host=options.host,
        port=DRAFTER_PORTS[0] if options.port is None else options.port,
        metrics_port=DRAFTER_PORTS[1] if options.metrics_port is None else options.metrics_port,
        tls=_tls(options),
        inject_delay_ms=options.inject_delay_ms,
        memory_scope=options.draft_memory_scope,
        max_memory_tokens=options.draft_memory_tokens or defaults.max_memory_tokens,
        min_draft_probability=(defaults.min_draft_probability if options.draft_min_probability is None
                               else options.draft_min_probability),
        drafting=options.drafting,
        **drain(options),
    )
