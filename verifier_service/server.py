"""`specd verifier`: load the model, warm up, then report SERVING and serve until SIGTERM.

The gRPC port opens first (health NOT_SERVING, Generate UNAVAILABLE) so that orchestrators see a
live process while the model loads; SERVING is reported only after a warm-up generation has run.
With --tensor-parallel-size N this process is rank 0 of N (verifier_service/parallel/): a rank that dies
or hangs turns health NOT_SERVING and ends the process non-zero, as a dead replica.
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

from specd import stop_signals
from specd.default_model import resolve_model_path
from specd.serving import GrpcServer
from specd.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from verifier_service.convert import ModelLimits
from verifier_service.engine.engine import Engine, build_model_runner
from verifier_service.engine.warm_up import freeze_start_up_objects, warm_up
from verifier_service.engine_loop import EngineLoop
from verifier_service.metrics import VerifierMetrics, VerifierMetricsExporter
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
    registry = CollectorRegistry()
    # Registered before the ports open, so /metrics has every family while the model loads.
    metrics = VerifierMetrics(registry, num_draft_positions=config.engine.speculative_tokens_limit)
    servicer = VerifierServicer(max_waiting_requests=config.max_waiting_requests)
    server = GrpcServer(config.server, service_names=[SERVICE_NAME], registry=registry,
                        register=lambda s: verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, s),
                        on_drain=servicer.drain)
    await server.start()
    leave = functools.partial(_leave_after_rank_failure, server, asyncio.get_running_loop())
    loading = _in_daemon_thread(_load_and_warm_up, config, metrics, leave)
    stopped = asyncio.ensure_future(stop_requested.wait())
    try:
        await asyncio.wait({loading, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            await server.stop(grace=0)
            _exit_while_loading()
        engine_loop, drafter = loading.result()
    except BaseException:  # e.g. a model that cannot be split: close the port before the error ends the process
        await server.stop(grace=0)
        raise
    finally:
        stopped.cancel()
    engine_loop.start()
    servicer.attach(engine_loop, model_limits(engine_loop.engine))
    await server.mark_ready()
    logger.info("verifier ready on port %d", server.port)
    try:
        await server.serve_until(stop_requested)
    finally:
        engine_loop.stop()
        if drafter is not None:
            drafter.close()
        engine_loop.engine.runner.close()


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


def _exit_while_loading() -> None:
    """A stop asked for during the load: the port is closed already; the load cannot be interrupted (it may
    be deep in native code, or compiling), so the process ends here rather than wait for it."""
    logger.info("stop requested while loading the model: exiting")
    logging.shutdown()
    os._exit(0)


def _load_and_warm_up(config: VerifierConfig, metrics: VerifierMetrics, on_rank_failure):
    """Builds the engine with its drafter client and runs one short generation (runs off the event loop)."""
    started = time.monotonic()
    drafter = _drafter_client(config)
    runner = build_model_runner(config.engine, drafter is not None, on_rank_failure=on_rank_failure)
    engine = Engine(config.engine, drafter, runner)
    _warm_up(engine)
    exporter = VerifierMetricsExporter(metrics, engine,
                                       read_fallbacks=(lambda: drafter.num_fallbacks) if drafter else (lambda: 0))
    logger.info("model loaded and warmed up in %.1f s", time.monotonic() - started)
    return EngineLoop(engine, after_step=exporter.export), drafter


def _leave_after_rank_failure(server: GrpcServer, loop: asyncio.AbstractEventLoop, reason: str) -> None:
    """A tensor-parallel rank died or hung (parallel/supervisor.py): this verifier cannot serve any more.

    Health turns NOT_SERVING at once, then the process ends non-zero without draining: the engine thread
    may wait in a collective for good, and the gateway resumes the streams elsewhere, as after any
    replica's death. The other ranks are killed first: they exit when rank 0 does, but a hung one cannot
    notice, and it would hold its GPU from the verifier that replaces this one. Runs on the thread that
    noticed the failure.
    """
    logger.error("verifier leaves the service: %s", reason)
    try:
        asyncio.run_coroutine_threadsafe(server.mark_not_serving(), loop).result(timeout=5.0)
    except Exception:  # noqa: BLE001 - the loop may be gone; exiting matters more
        logger.exception("could not report NOT_SERVING")
    time.sleep(RANK_FAILURE_EXIT_DELAY_S)  # also the hung ranks' time to write the stacks they were asked for
    for rank in multiprocessing.active_children():  # ranks 1..N-1 (the spawn workers)
        rank.kill()
    os._exit(RANK_FAILURE_EXIT_CODE)


def _drafter_client(config: VerifierConfig):
    if config.drafter_addr is None:
        return None
    from verifier_service.drafter_client import DrafterClient

    return DrafterClient(config.drafter_addr, tls=config.drafter_tls)


def _warm_up(engine: Engine) -> None:
    """The engine's warm-up (engine/warm_up.py), then the collector told to leave what start-up made alone."""
    warm_up(engine)
    freeze_start_up_objects()


def model_limits(engine: Engine) -> ModelLimits:
    """What requests are validated against, from the loaded model."""
    name = resolve_model_path(engine.config.model).name
    return ModelLimits(name=name, max_model_len=engine.max_model_len, vocab_size=engine.vocab_size)
