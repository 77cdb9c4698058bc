"""`specd verifier`: start the engine process, let it load and warm up, then report SERVING and serve until SIGTERM.

The gRPC port opens first (health NOT_SERVING, Generate UNAVAILABLE) so that orchestrators see a
live process while the model loads; SERVING is reported only after a warm-up generation has run. The engine runs
in a process of its own (engine_process.py); this one serves gRPC and exports the metrics. With
--tensor-parallel-size N the engine process is rank 0 of N (verifier_service/parallel/): a rank that dies or hangs,
or the engine process itself dying, turns health NOT_SERVING and ends this process non-zero, as a dead replica.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import threading
import time

from prometheus_client import CollectorRegistry

from specd import environment, stop_signals
from specd.serving import GrpcServer
from specd.startup_errors import StartupError
from specd.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from verifier_service.engine_process import EngineClient
from verifier_service.metrics import VerifierMetrics, VerifierMetricsExporter
from verifier_service.serve_socket import ServeSocket
from verifier_service.service import VerifierServicer

logger = logging.getLogger(__name__)
SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name
RANK_FAILURE_EXIT_CODE = 3
RANK_FAILURE_EXIT_DELAY_S = 1.0  # NOT_SERVING shows this long before the process ends


def serve(config: VerifierConfig) -> None:
    """Blocks until SIGTERM / SIGINT, then drains in-flight requests and stops."""
    asyncio.run(serve_async(config))


async def serve_async(config: VerifierConfig) -> None:
    async with stop_signals.caught() as stop_requested:
        await _serve(config, stop_requested)


async def _serve(config: VerifierConfig, stop_requested: asyncio.Event) -> None:
    try:
        environment.drafter_probe_steps()  # read by the drafter link in the engine process: refused here, before it
    except ValueError as error:
        raise StartupError(str(error)) from None
    registry = CollectorRegistry()
    # Registered before the ports open, so /metrics has every family while the model loads.
    metrics = VerifierMetrics(registry, max_speculative_tokens=config.engine.speculative_tokens_limit)
    servicer = VerifierServicer(max_waiting_requests=config.max_waiting_requests,
                                first_token=metrics.time_to_first_token.observe)
    server = GrpcServer(config.server, service_names=[SERVICE_NAME], registry=registry,
                        register=lambda s: verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, s),
                        on_drain=servicer.drain)
    await server.start()
    try:
        serve_socket = await ServeSocket(servicer.serve).start(config.server.host, config.serve_port, config.server.tls)
        servicer.serve_port = serve_socket.port  # named in the load reports
    except BaseException:
        await server.stop(grace=0)
        raise
    leave = functools.partial(_leave_after_rank_failure, server, asyncio.get_running_loop())
    started = time.monotonic()
    engine = EngineClient(config, VerifierMetricsExporter(metrics), on_failure=leave)
    loading = _in_daemon_thread(engine.wait_ready)
    stopped = asyncio.ensure_future(stop_requested.wait())

    async def end_start_up() -> None:
        """Start-up ends early: the engine process goes, and both ports close at once (nothing ran on them yet)."""
        engine.kill()
        serve_socket.close()
        await server.stop(grace=0)

    try:
        await asyncio.wait({loading, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():  # a stop during the load
            logger.info("stop requested while loading the model: exiting")
            loading.cancel()  # the load's end (the killed engine process's error) is nobody's news now
            await end_start_up()
            return
        limits = loading.result()
    except BaseException:  # e.g. a model that cannot be split: close the ports before the error ends the process
        await end_start_up()
        raise
    finally:
        stopped.cancel()
    engine.start()
    servicer.attach(engine, limits)
    await server.mark_ready()
    logger.info("verifier ready on port %d, Serve socket on %d (model loaded and warmed up in %.1f s)", server.port,
                servicer.serve_port, time.monotonic() - started)
    try:
        await server.serve_until(stop_requested)
    finally:
        await servicer.streams_ended(config.server.grace_seconds)  # the drain has told the socket's streams to end
        serve_socket.close()
        engine.stop()


def _in_daemon_thread(function, *args) -> asyncio.Future:
    """`function(*args)` on a daemon thread, as a future of this loop (asyncio.to_thread's threads would
    hold the process open until the load ends)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = function(*args)
        except BaseException as raised:  # noqa: BLE001 - handed to the awaiting coroutine
            error = raised
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="load-model", daemon=True).start()
    return future


def _leave_after_rank_failure(server: GrpcServer, loop: asyncio.AbstractEventLoop, reason: str) -> None:
    """A tensor-parallel rank died or hung (parallel/supervisor.py), or the engine process did: this verifier
    cannot serve any more.

    Health turns NOT_SERVING at once, then the process ends non-zero without draining: the engine may wait in a
    collective for good, and the gateway resumes the streams elsewhere, as after any replica's death. The engine
    process (which killed the other ranks first: a hung one cannot notice rank 0's end, and it would hold its GPU
    from the verifier that replaces this one) is killed with it. Runs on the thread that noticed the failure.
    """
    logger.error("verifier leaves the service: %s", reason)
    try:
        asyncio.run_coroutine_threadsafe(server.mark_not_serving(), loop).result(timeout=5.0)
    except Exception:  # noqa: BLE001 - the loop may be gone; exiting matters more
        logger.exception("could not report NOT_SERVING")
    time.sleep(RANK_FAILURE_EXIT_DELAY_S)  # also the hung ranks' time to write the stacks they were asked for
    for child in multiprocessing.active_children():  # the engine process
        child.kill()
    os._exit(RANK_FAILURE_EXIT_CODE)
