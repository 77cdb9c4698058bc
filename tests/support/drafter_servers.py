"""Real drafter servers for tests: in a background thread (to look inside) or a process."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.local_stack import free_port
from drafter_service.batch import DraftRequest
from drafter_service.client import DrafterClient
from drafter_service.config import DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.server import build_server


class ThreadedDrafter:
    """A drafter server on its own event loop thread, so sync clients can call it from the test thread."""

    def __init__(self, config: DrafterConfig, store_backend: str | None = None) -> None:
        self.drafter = Drafter(config, store_backend)
        self.server = build_server(config, self.drafter)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedDrafter:
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        await self.server.start()
        await self.server.mark_ready()

    def call(self, coroutine, timeout: float = 10):
        """Run a coroutine on the server's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def on_loop(self, function):
        """Run a plain function on the server's loop (the only thread that touches the store)."""
        async def wrapped():
            return function()
        return self.call(wrapped())

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def __exit__(self, *exc) -> None:
        self.call(self.server.stop(grace=0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def wait_until_serving(address: str, timeout: float = 30) -> None:
    """Block until the server at `address` reports SERVING on its health check."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1, wait_for_ready=True)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} did not report SERVING within {timeout} s")
            time.sleep(0.05)  # the server is up but not ready yet: poll


def start_drafter_process(port: int) -> subprocess.Popen:
    """`python -m drafter_service.server PORT` (no metrics port), returned once it is SERVING."""
    repo_root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen([sys.executable, "-m", "drafter_service.server", str(port)], cwd=repo_root)
    try:
        wait_until_serving(f"127.0.0.1:{port}")
    except BaseException:
        process.kill()
        raise
    return process


def connected(address: str) -> DrafterClient:
    """A client whose stream is up (it connects in the background)."""
    client = DrafterClient(address, timeout_s=5.0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        fallbacks = client.num_fallbacks
        client.propose([DraftRequest("probe", [0, 0], 1)])
        if client.num_fallbacks == fallbacks:
            client.release(["probe"])
            return client
        time.sleep(0.02)  # not connected yet: nothing to await, the connection thread retries
    raise TimeoutError("the drafter client never got an answer")


# A request another verifier served: its prompt and output, remembered by a drafter with memory once released.
SERVED_PROMPT, SERVED_OUTPUT = [1, 2, 3], list(range(100, 112))


def serve_and_release(client: DrafterClient, request_id: str, tenant: str = "") -> None:
    """SERVED_PROMPT + SERVED_OUTPUT as a verifier serves a request: drafted step by step, then released (its output
    remembered)."""
    context = SERVED_PROMPT + SERVED_OUTPUT[:1]
    for token in SERVED_OUTPUT[1:]:
        client.propose([DraftRequest(request_id, context, 4, tenant_key=tenant)])
        context.append(token)
    client.propose([DraftRequest(request_id, context, 0, tenant_key=tenant)])
    client.release([request_id])
    client.propose([DraftRequest("barrier", [0], 1)])  # the stream is ordered: the release is applied now
