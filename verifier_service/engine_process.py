"""The engine in a process of its own (as vLLM V1's EngineCore), the verifier's gRPC serving in another.

One interpreter holding both the engine thread and the gRPC threads made them take turns on its lock: every
message the service layer built or sent was time the engine's host work waited. Here the serving process starts the
engine process (spawn: CUDA is only ever initialised there), and the two exchange one pipe message per step:

    serving -> engine   ("add", request_id, prompt_token_ids, params) | ("abort", request_id) | ("stop",)
    engine -> serving   ("ready", ModelLimits) | ("startup_error", line) | ("failed", message) once, then per step
                        ("step", outputs, step_stats, load, num_added, drafter_counts) (outputs as columns:
                        step_message.py; drafter_counts: the proposer's running fallback, context-draft and
                        unasked-step totals),
                        ("load", load, num_added) after additions or aborts between steps,
                        ("rank_failure", reason) when a tensor-parallel rank dies or hangs

The engine process loads the model (its drafter client, and its tensor-parallel ranks, are its own), warms up,
then runs an EngineLoop whose outputs go to the pipe; a thread there applies adds and aborts as they come (an abort
frees the request's blocks at once, as in one process). `EngineClient`, in the serving process, has the
EngineLoop's interface for the servicer: it routes each step's outputs to the requests' asyncio queues
(output_router.py) and exports the metrics, off the engine's interpreter. If the engine process dies, every live
request fails UNAVAILABLE (the gateway resumes it on another replica) and `on_failure` takes the verifier out.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from specd.pipe_frames import pickled
from specd.sampling import SamplingParams
from specd.startup_errors import StartupError
from verifier_service import step_message
from verifier_service.convert import ModelLimits
from verifier_service.engine.outputs import EngineLoad
from verifier_service.metrics import VerifierMetricsExporter
from verifier_service.output_router import EngineUnavailable, OutputRouter, RequestFailed

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0  # the engine's current step, closing its drafter client and ranks


class EngineClient:
    """The serving process's side: starts the engine process and stands for its EngineLoop."""

    def __init__(self, config, exporter: VerifierMetricsExporter,
                 on_failure: Callable[[str], None] = lambda reason: None) -> None:
        self._exporter, self._on_failure = exporter, on_failure
        self._router = OutputRouter()
        self._send_lock = threading.Lock()
        self._num_sent = 0  # additions sent to the engine process
        self._num_added = 0  # of those, the ones its last load report counts
        self._stopping = False
        self.load = EngineLoad(0, 0, 0, 0)
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self.process = context.Process(target=run_engine_process, args=(config, child_conn, os.getpid()),
                                       name="specd-engine")
        self.process.start()
        child_conn.close()
        self._reader = threading.Thread(target=self._read, name="engine-outputs", daemon=True)

    def wait_ready(self) -> ModelLimits:
        """Blocks until the model is loaded and warmed up; raises RuntimeError with the engine's error."""
        try:
            message = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine process exited with code {self.process.exitcode} while loading") from None
        if message[0] == "failed":
            raise RuntimeError(message[1])
        if message[0] == "startup_error":
            raise StartupError(message[1])
        return message[1]

    def start(self) -> None:
        self._reader.start()

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, queue=None):
        queue = self._router.register(request_id, queue)  # DuplicateRequestId for a live id
        with self._send_lock:
            self._num_sent += 1
            self._send(("add", request_id, list(prompt_token_ids), params))
        return queue

    def abort(self, request_id: str) -> None:
        if self._router.forget(request_id):
            with self._send_lock:
                self._send(("abort", request_id))

    def queue_state(self) -> tuple[EngineLoad, int]:
        with self._send_lock:
            return self.load, self._num_sent - self._num_added

    def stop(self) -> None:
        """Stops the engine process (its current step ends first); killed if it takes longer than STOP_TIMEOUT_S."""
        self._stopping = True
        with self._send_lock:
            self._send(("stop",))
        self.process.join(STOP_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        self._stopping = True
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def _send(self, message) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):  # the engine process is gone: the reader reports it
            pass

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "step":
                _, packed, steps, load, num_added, drafter_counts = message
                self._loaded(load, num_added)
                self._router.deliver(step_message.unpack(packed))
                self._exporter.export(steps, load, *drafter_counts)
            elif kind == "load":
                self._loaded(*message[1:])
            elif kind == "rank_failure":
                self._on_failure(message[1])
        if not self._stopping:
            self._engine_lost()

    def _loaded(self, load: EngineLoad, num_added: int) -> None:
        with self._send_lock:
            self.load, self._num_added = load, num_added

    def _engine_lost(self) -> None:
        self.process.join(5.0)  # its end closed the pipe: reap it for its exit code
        reason = f"the engine process exited with code {self.process.exitcode}"
        logger.error("%s; failing %d live requests", reason, len(self._router.live()))
        error = EngineUnavailable(reason)
        self._router.deliver([RequestFailed(request_id, error) for request_id in self._router.live()])
        self._on_failure(reason)


def run_engine_process(config, conn: Connection, parent_pid: int) -> None:
    """The engine process (spawn target): load, warm up, then serve the pipe until ("stop",) or the parent's end."""
    from specd import stop_signals

    stop_signals.die_with_parent(signal.SIGKILL, parent_pid)
    for signum in stop_signals.STOP_SIGNALS:  # the serving process decides when to stop (a terminal's Ctrl-C too)
        signal.signal(signum, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s verifier[engine] %(levelname)s %(name)s: %(message)s")
    sender = threading.Lock()

    def send(message) -> None:
        payload = pickled(message)  # what Connection.send writes, without its per-call pickler (every step)
        with sender:
            conn.send_bytes(payload)

    try:
        engine_loop, drafter = _load(config, send)
    except StartupError as error:  # a setting it cannot start with: one line, as in one process
        send(("startup_error", str(error)))
        return
    except Exception as error:  # noqa: BLE001 - reported to the serving process, which exits with it
        logger.exception("loading the model failed")
        send(("failed", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}"))
        return
    send(("ready", engine_loop.limits))
    engine_loop.start()
    try:
        _serve_pipe(conn, engine_loop, send)
    finally:
        engine_loop.stop()
        close = getattr(drafter, "close", None)  # the in-process drafter has nothing to close
        if close is not None:
            close()
        engine_loop.engine.runner.close()


def _load(config, send):
    """The engine with its drafter client, warmed up, in an EngineLoop that sends each step down the pipe."""
    from specd.default_model import resolve_model_path
    from verifier_service.engine.engine import Engine
    from verifier_service.runners import build_model_runner
    from verifier_service.engine.start_up_objects import freeze as freeze_start_up_objects
    from verifier_service.engine.warm_up import warm_up
    from verifier_service.engine_loop import EngineLoop

    started = time.monotonic()
    drafter = _drafter_client(config)

    def on_rank_failure(reason: str) -> None:
        for rank in multiprocessing.active_children():  # ranks 1..N-1: a hung one cannot notice rank 0's end
            rank.kill()
        send(("rank_failure", reason))

    runner = build_model_runner(config.engine, drafter is not None, on_rank_failure=on_rank_failure)
    engine = Engine(config.engine, drafter, runner)
    warm_up(engine)
    freeze_start_up_objects()
    logger.info("model loaded and warmed up in %.1f s", time.monotonic() - started)
    def drafter_counts() -> tuple[int, int, int]:  # only the service's client falls back; only its link drafts itself
        return (getattr(drafter, "num_fallbacks", 0), getattr(drafter, "num_context_drafts", 0),
                getattr(drafter, "num_unasked", 0))
    step_items: list = []

    def after_step() -> None:
        packed = step_message.pack(step_items)  # new lists: the step's items can go
        step_items.clear()
        send(("step", packed, engine.take_step_stats(), engine_loop.load, engine_loop.num_added, drafter_counts()))

    engine_loop = EngineLoop(engine, after_step=after_step, emit=step_items.extend)
    engine_loop.limits = ModelLimits(name=resolve_model_path(config.engine.model).name,
                                     max_model_len=engine.max_model_len, vocab_size=engine.vocab_size)
    return engine_loop, drafter


def _drafter_client(config):
    """The engine's proposer: the drafter service's client, the drafter's rule in this process, or none."""
    if config.in_process_drafter is not None:
        from drafter_service.local import LocalProposer

        return LocalProposer(config.in_process_drafter)
    if config.drafter_addr is None:
        return None
    engine = config.engine
    if engine.async_scheduling if engine.async_scheduling is not None else engine.device == "cuda":
        from drafter_service.link import DrafterLink  # the client's threads away from the engine's interpreter

        return DrafterLink(config.drafter_addr, tls=config.drafter_tls)
    from drafter_service.client import DrafterClient
    from drafter_service.context_first import ContextFirstProposer  # waits for the service only where its memory drafts

    return ContextFirstProposer(DrafterClient(config.drafter_addr, tls=config.drafter_tls))


def _serve_pipe(conn: Connection, engine_loop, send) -> None:
    """Applies the serving process's adds and aborts until it says stop (or is gone)."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "add":
            engine_loop.add(*message[1:])
        elif message[0] == "abort":
            engine_loop.abort(message[1])
            send(("load", engine_loop.load, engine_loop.num_added))
        elif message[0] == "stop":
            return
