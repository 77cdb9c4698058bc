"""Routes the engine's per-step outputs to asyncio queues, one per Generate call or Serve stream.

A request is registered with the queue its outputs go to (several requests may share one: a Serve stream's);
`deliver` takes one step's items for many requests and puts one list on each queue, through one
`loop.call_soon_threadsafe` per queue, whatever thread it runs on. A request's last item (finished output or
RequestFailed) ends its registration. Used in the process that serves gRPC: beside the engine thread
(EngineLoop) or across the engine process's pipe (engine_process.EngineClient).
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from verifier_service.engine.outputs import RequestOutput


class DuplicateRequestId(ValueError):
    """A request id already live on this verifier."""


class EngineUnavailable(RuntimeError):
    """The engine process is gone: what it was running is lost (UNAVAILABLE, so the caller retries elsewhere)."""


@dataclass(frozen=True)
class RequestFailed:
    """On a request's queue instead of an output: the engine could not add it, or a step failed; its last item."""

    request_id: str
    error: Exception


class OutputRouter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    def register(self, request_id: str, queue: asyncio.Queue | None = None) -> asyncio.Queue:
        """The queue (a new one when None) that `request_id`'s outputs will go to, from the running loop."""
        queue = asyncio.Queue() if queue is None else queue
        with self._lock:
            if request_id in self._queues:
                raise DuplicateRequestId(f"request_id: {request_id!r} is already running on this verifier")
            self._queues[request_id] = (asyncio.get_running_loop(), queue)
        return queue

    def forget(self, request_id: str) -> bool:
        """No more outputs for this request (aborted); False when it was not registered (any more)."""
        with self._lock:
            return self._queues.pop(request_id, None) is not None

    def live(self) -> list[str]:
        with self._lock:
            return list(self._queues)

    def deliver(self, items: list[RequestOutput | RequestFailed]) -> None:
        """Each item to its request's queue: one list per queue, one wake-up of its loop per queue."""
        lists: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, list]] = {}
        with self._lock:
            for item in items:
                finished = isinstance(item, RequestFailed) or item.finished
                target = (self._queues.pop(item.request_id, None) if finished
                          else self._queues.get(item.request_id))
                if target is not None:
                    lists.setdefault(id(target[1]), (*target, []))[2].append(item)
        for loop, queue, delivered in lists.values():
            loop.call_soon_threadsafe(queue.put_nowait, delivered)
