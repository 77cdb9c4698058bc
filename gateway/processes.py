"""`--gateway-processes N`: N gateway processes sharing the gRPC and HTTP ports, so the front door uses N cores.

Each worker is a whole gateway (tokenizer, router, pipeline, both servers) in a process of its own, bound to the
same ports with SO_REUSEPORT: the kernel spreads new connections over the workers, and a connection stays with the
worker that accepted it. The first process only supervises: it checks that both ports are free (so a second stack
on the same ports fails as with one process, instead of sharing them), points every worker at one Prometheus
multiprocess folder (GET /metrics, answered by whichever worker takes the connection, sums all of them: metrics.py),
forwards SIGTERM / SIGINT (each worker drains as a lone gateway does), and exits non-zero, stopping the others, when a
worker dies, so the orchestrator restarts the whole front door.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time

from gateway.config import GatewayConfig
from gateway.server import serve
from gateway.tokenizer import encode_serially
from specd import stop_signals
from specd.startup_errors import bound_socket

logger = logging.getLogger(__name__)

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's switch to per-process metric files
STOP_MARGIN_SECONDS = 10.0  # after a worker's drain: closing its channels, the process exit


class GatewayWorkerDied(SystemExit):
    """A worker process ended on its own: the gateway stops (exit code 1) so that it is restarted whole."""

    def __init__(self, name: str, exit_code: int | None) -> None:
        super().__init__(1)
        self.name, self.exit_code = name, exit_code


def main(config: GatewayConfig) -> None:
    """`specd gateway`: one gateway process, or with `processes` > 1 that many."""
    encode_serially()  # inherited by the workers
    if config.processes > 1:
        serve_processes(config)
    else:
        asyncio.run(serve(config))


def serve_processes(config: GatewayConfig) -> None:
    """Runs `config.processes` gateway workers until SIGTERM / SIGINT or a worker's death (GatewayWorkerDied)."""
    for port, option in ((config.grpc_port, "port"), (config.http_port, "http-port")):
        bound_socket(config.host, port, option).close()  # PortInUse, naming the option, before any worker starts
    metrics_dir = tempfile.mkdtemp(prefix="specd-gateway-metrics-")
    os.environ[MULTIPROCESS_ENV] = metrics_dir  # inherited by the workers, read before they import prometheus_client
    context = multiprocessing.get_context("spawn")
    worker_config = dataclasses.replace(config, processes=1, reuse_port=True)
    workers = [context.Process(target=_worker, args=(worker_config, os.getpid()), name=f"gateway-{index}")
               for index in range(config.processes)]
    for worker in workers:
        worker.start()
    logger.info("gateway: %d processes on gRPC %s:%d and HTTP %s:%d", len(workers), config.host,
                config.grpc_port, config.host, config.http_port)
    try:
        dead = _wait_for_stop_or_death(workers)
    finally:
        _stop(workers, config.grace_seconds + STOP_MARGIN_SECONDS)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if dead is not None:
        logger.error("gateway process %s exited with code %s; stopping the gateway", dead.name, dead.exitcode)
        raise GatewayWorkerDied(dead.name, dead.exitcode)


def _worker(config: GatewayConfig, parent_pid: int) -> None:
    """One gateway process (the spawn target): serves until SIGTERM / SIGINT, then drains; killed with the first
    process, should that one be killed (its ports must not outlive it: a restarted gateway binds them again)."""
    stop_signals.die_with_parent(signal.SIGKILL, parent_pid)
    stop_signals.install()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s gateway[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config))
    stop_signals.ignore()


def _wait_for_stop_or_death(workers: list[multiprocessing.Process]) -> multiprocessing.Process | None:
    sentinels = {worker.sentinel: worker for worker in workers}
    while not stop_signals.requested():
        ready = multiprocessing.connection.wait(list(sentinels), timeout=0.2)
        if ready:
            return sentinels[ready[0]]
    return None


def _stop(workers: list[multiprocessing.Process], timeout: float) -> None:
    """SIGTERM to every live worker (each drains), then SIGKILL to any still running after `timeout`."""
    for worker in workers:
        if worker.is_alive():
            os.kill(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()
