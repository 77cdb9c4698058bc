"""Runs the engine in its own thread and hands each step's outputs to whoever serves them.

Only this thread steps the engine: callers enqueue additions (and aborts of requests the thread is still adding;
other aborts go to the engine at once), the thread drains them between steps, calls `step()` while there is work and
sleeps on an event when idle. After each step `emit` gets the step's outputs (and RequestFailed items: a failure while
adding a request, or inside `step()`, which fails every live request), then `after_step` runs. In the engine process
(engine_process.py) both go through the pipe to the serving process; in one process (the tests') an OutputRouter puts
them on the requests' asyncio queues, and `add` returns the queue.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from specd.sampling import SamplingParams
from verifier_service.engine.outputs import EngineLoad, RequestOutput
from verifier_service.output_router import DuplicateRequestId, OutputRouter, RequestFailed

__all__ = ["DuplicateRequestId", "EngineLoop", "RequestFailed"]

logger = logging.getLogger(__name__)


@dataclass
class _Addition:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class EngineLoop:
    """The only owner of the engine after `start()`.

    `after_step` runs on the engine thread after every step (and after aborts are applied); the metrics exporter
    hangs off it, so the step loop itself stays free of counting code. Without `emit`, outputs go to the queues of an
    OutputRouter (this process serves the requests).
    """

    def __init__(self, engine, after_step: Callable[[], None] | None = None,
                 emit: Callable[[list[RequestOutput | RequestFailed]], None] | None = None) -> None:
        self.engine = engine  # read-only use outside the thread: model facts fixed at load time
        self._engine = engine
        self._after_step = after_step or (lambda: None)
        self._router = OutputRouter() if emit is None else None
        self._emit = emit if emit is not None else self._router.deliver
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._additions: list[_Addition] = []
        self._num_adding = 0  # additions the thread has taken and not yet shown in `load`
        self._num_added = 0  # additions applied or dropped since start (the engine process reports it with each load)
        self._aborts: list[str] = []
        self._live: set[str] = set()  # added and not finished, failed or aborted
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.load: EngineLoad = engine.load()  # last snapshot, replaced (never mutated) by the thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread after its current step; live requests get no more outputs."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join()

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            queue: asyncio.Queue | None = None) -> asyncio.Queue | None:
        """Queues a request. In one process, lists of its outputs (ending with the finished one, or a RequestFailed)
        arrive on `queue` (a new one when None), which is returned; a live id raises DuplicateRequestId."""
        if self._router is not None:
            queue = self._router.register(request_id, queue)
        with self._lock:
            self._live.add(request_id)
            self._additions.append(_Addition(request_id, list(prompt_token_ids), params))
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> None:
        """Aborts a live request (client cancel or deadline) at once, whatever the engine thread is doing.

        A request the engine has not taken yet is dropped here and never reaches it. One it has is aborted in
        the engine directly (Engine.abort is safe from any thread): its blocks are free and it is out of the
        next schedule even while a long step runs - queued for the thread, the abort would wait for the end of
        that step, and under async scheduling of the step launched behind it. One the thread has taken but not
        yet added is left to the thread, which aborts it after adding it."""
        if self._router is not None:
            self._router.forget(request_id)
        with self._lock:
            if request_id not in self._live:
                return
            self._live.discard(request_id)
            pending = [a for a in self._additions if a.request_id != request_id]
            if len(pending) < len(self._additions):
                self._num_added += len(self._additions) - len(pending)  # dropped: no longer pending either
                self._additions = pending
                return
        if self._engine.abort(request_id):
            self.load = self._engine.load()
            return
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def queue_state(self) -> tuple[EngineLoad, int]:
        """The last load snapshot and the requests handed in that it does not count yet, read together."""
        with self._lock:
            return self.load, len(self._additions) + self._num_adding

    @property
    def num_added(self) -> int:
        """Additions no longer pending since start: taken in by the engine (valid or not) or dropped by an abort."""
        return self._num_added

    def _run(self) -> None:
        while not self._stopping:  # checked before waiting: a wake-up cleared between steps is lost
            self._wake.wait()
            with self._lock:
                if self._stopping:
                    return
                self._wake.clear()
                additions, aborts = self._take()
            self._apply(additions, aborts)
            while self._engine.has_unfinished_requests() and not self._stopping:
                self._step()
                self._drain_between_steps()
            self.load = self._engine.load()
            self._after_step()

    def _drain_between_steps(self) -> None:
        with self._lock:
            additions, aborts = self._take()
            self._wake.clear()
        self._apply(additions, aborts)

    def _take(self) -> tuple[list[_Addition], list[str]]:
        """Under the lock: the queued additions and aborts, for `_apply`."""
        additions, self._additions = self._additions, []
        aborts, self._aborts = self._aborts, []
        self._num_adding = len(additions)
        return additions, aborts

    def _apply(self, additions: list[_Addition], aborts: list[str]) -> None:
        for request_id in aborts:
            self._engine.abort(request_id)
        failed = []
        for addition in additions:
            try:
                self._engine.add_request(addition.request_id, addition.prompt_token_ids, addition.params)
            except Exception as error:  # noqa: BLE001 - goes back to the caller, who maps it to a status
                failed.append(RequestFailed(addition.request_id, error))
            with self._lock:
                aborted = addition.request_id not in self._live  # while the thread was adding it
            if aborted:
                self._engine.abort(addition.request_id)
        if failed:
            self._deliver(failed)
        if additions or aborts:  # the report counts the additions as pending until this snapshot has them
            load = self._engine.load()
            with self._lock:
                self.load, self._num_adding = load, 0
                self._num_added += len(additions)

    def _step(self) -> None:
        try:
            outputs = self._engine.step()
        except Exception as error:  # noqa: BLE001 - a broken step fails its requests, not the server
            logger.exception("engine step failed; failing %d live requests", len(self._live))
            self._fail_all(error)
            return
        self.load = self._engine.load()
        self._deliver(outputs)
        self._after_step()

    def _deliver(self, items: list[RequestOutput | RequestFailed]) -> None:
        with self._lock:
            for item in items:
                if isinstance(item, RequestFailed) or item.finished:
                    self._live.discard(item.request_id)
        self._emit(items)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            request_ids = list(self._live)
        for request_id in request_ids:
            self._engine.abort(request_id)
        self._deliver([RequestFailed(request_id, error) for request_id in request_ids])
