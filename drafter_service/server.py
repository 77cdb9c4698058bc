"""Starts the drafter: `run(config)` is what `specd drafter` calls; `serve(config)` is its coroutine.

Defaults (DrafterConfig): gRPC on 0.0.0.0:50071, Prometheus /metrics on 9471. The drafter holds no
model, so it reports SERVING as soon as it listens. SIGTERM / SIGINT drain it (specd/serving.py).
"""
from __future__ import annotations

import asyncio
import logging

from drafter_service.config import DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.metrics import DrafterMetrics
from drafter_service.service import DrafterServicer
from specd import stop_signals
from specd.serving import GrpcServer, ServerConfig
from specd.v1 import drafter_pb2, drafter_pb2_grpc

SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name  # "specd.v1.Drafter"


def build_server(config: DrafterConfig, drafter: Drafter | None = None) -> GrpcServer:
    """A GrpcServer with the Drafter servicer registered (not started); `drafter` lets tests look in."""
    metrics = DrafterMetrics()
    servicer = DrafterServicer(drafter or Drafter(config), on_step=metrics.record,
                               inject_delay_seconds=config.inject_delay_ms / 1000)
    server_config = ServerConfig(host=config.host, port=config.port, metrics_port=config.metrics_port,
                                 tls=config.tls, grace_seconds=config.grace_seconds)
    return GrpcServer(server_config, service_names=[SERVICE_NAME], registry=metrics.registry,
                      register=lambda s: drafter_pb2_grpc.add_DrafterServicer_to_server(servicer, s))


async def serve(config: DrafterConfig) -> None:
    """Serve until SIGTERM / SIGINT, then drain."""
    async with stop_signals.caught() as stop_requested:
        server = build_server(config)
        await server.start()
        await server.mark_ready()
        await server.serve_until(stop_requested)


def run(config: DrafterConfig | None = None) -> None:
    """Blocking entry point for the CLI (`specd drafter`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config or DrafterConfig()))


if __name__ == "__main__":  # python -m drafter_service.server [port]: used by tests and benches
    import sys

    run(DrafterConfig(port=int(sys.argv[1]), metrics_port=None) if len(sys.argv) > 1 else None)
