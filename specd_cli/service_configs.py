"""Maps the shared CLI options onto the gateway's frozen config.

(The verifier's and the drafter's live beside their configs: verifier_service/config.py, drafter_service/config.py,
since a verifier builds the drafter's for --drafter-addr in-process.) Ports left unset take the
defaults of docs/PUBLIC_SURFACE.md.
"""
from __future__ import annotations

from specd.default_model import resolve_model_path
from specd.options import GATEWAY_PORTS, ServiceOptions, drain
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
        stream_interval=options.stream_interval,
        verifier_transport=options.verifier_transport,
        **drain(options),
    )
