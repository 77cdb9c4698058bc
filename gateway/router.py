"""Routes each request to the least-loaded healthy verifier replica, failing over before the first token.

A background task polls every replica's grpc health and Verifier.GetLoad. Requests reach a replica over
one Serve stream per replica (gateway/verifier_stream.py). A request goes to the
healthy replica with the least load (the requests this gateway has in flight on it, plus those its
last load report shows from other callers; ties go round-robin). If the call fails with a retryable
status, the request is sent to another replica: before its first token as it was, after it as a
resumption (gateway/resume.py: prompt plus the tokens already streamed, the remaining max_tokens), so
a dying replica costs no request while another one is left. Closing the stream (client gone) cancels
the verifier call, and the remaining deadline travels with every attempt.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway import convert
from gateway.request import GenerationRequest, ReplicaLoad, VerifierChunk
from gateway.resume import StreamProgress
from gateway.verifier_stream import UpstreamError, VerifierStream
from specd.serve_socket import client_ssl
from specd.serving import TlsConfig, open_channel
from specd.v1 import verifier_pb2_grpc

logger = logging.getLogger(__name__)

VERIFIER_SERVICE = "specd.v1.Verifier"
# A replica that is down, draining or full can take no new work; another replica may. CANCELLED here comes
# from the replica, never from us (our own cancel raises CancelledError in our task): grpc answers it to a call
# that reaches a server in the moment its drain begins.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                             grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})


class Replica:
    """One verifier address: its channel, last load report, health, and this gateway's calls on it."""

    def __init__(self, address: str, tls: TlsConfig | None, stream_interval: int = 1,
                 transport: str = "socket") -> None:
        self.address = address
        self.channel = open_channel(address, tls)
        self.stub = verifier_pb2_grpc.VerifierStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.transport, self.ssl = transport, client_ssl(tls)
        # The Serve socket the streams go to (0: gRPC Serve): the one the load report names once a connection to it
        # has succeeded. A socket it cannot reach (a load balancer or a network policy in between that lets only the
        # gRPC port through) leaves the replica on gRPC Serve, tried again when the report names another port.
        self.serve_port = 0
        self._probed_port = 0
        self.stream = VerifierStream(self.stub, address, stream_interval, lambda: self.serve_port, self.ssl)
        self.healthy = False
        self.load = ReplicaLoad()
        self.in_flight = 0
        self.in_flight_at_report = 0  # this gateway's calls when the load report arrived

    def score(self) -> tuple[int, float]:
        """This gateway's live calls (always current) plus the report's requests from elsewhere.

        The report is up to a poll interval old: counting it whole would keep a burst that just
        finished here as load, and send the next burst entirely to the other replicas.
        """
        reported = self.load.num_running + self.load.num_waiting
        others = max(0, reported - self.in_flight_at_report)
        return self.in_flight + others, self.load.kv_cache_usage

    async def poll(self, timeout: float) -> None:
        """Refreshes health and load; any failure marks the replica unhealthy until the next poll."""
        try:
            health = await self.health_stub.Check(
                health_pb2.HealthCheckRequest(service=VERIFIER_SERVICE), timeout=timeout)
            report = await self.stub.GetLoad(convert.get_load_request(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            self._set_healthy(False, error.code().name)
            return
        self.load = convert.load_from_pb(report)
        self.in_flight_at_report = self.in_flight
        if self.transport == "socket" and self.load.serve_port != self._probed_port:
            await self._probe_serve_socket(self.load.serve_port, timeout)
        self._set_healthy(health.status == health_pb2.HealthCheckResponse.SERVING, "NOT_SERVING")

    async def _probe_serve_socket(self, port: int, timeout: float) -> None:
        self._probed_port, self.serve_port = port, 0
        if not port:
            return
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.stream.host, port, ssl=self.ssl), timeout)
        except (OSError, asyncio.TimeoutError) as error:
            logger.warning("verifier %s: its Serve socket (port %d) is unreachable (%s); streaming over gRPC Serve",
                           self.address, port, error or type(error).__name__)
            return
        writer.close()
        self.serve_port = port

    def _set_healthy(self, healthy: bool, reason: str) -> None:
        if healthy != self.healthy:
            logger.info("verifier %s is %s", self.address, "healthy" if healthy else f"unhealthy ({reason})")
        self.healthy = healthy


class ReplicaPin:
    """Keeps calls that share a prompt on the replica the first one went to (the `n` samples of one prompt:
    the later ones find its KV blocks in that replica's prefix cache), while it is healthy."""

    def __init__(self) -> None:
        self.replica: Replica | None = None


class Router:
    """Spreads requests over verifier replicas; `start()` before use, `close()` at shutdown."""

    def __init__(self, addresses: Sequence[str], tls: TlsConfig | None = None,
                 poll_interval: float = 0.5, stream_interval: int = 1, transport: str = "socket") -> None:
        """stream_interval: tokens a request's stream gathers before it wakes (verifier_stream.Updates);
        transport: "socket" streams over each replica's Serve socket where it reports one, "grpc" over gRPC Serve."""
        if not addresses:
            raise ValueError("verifier_addrs: at least one verifier address is needed")
        self.replicas = [Replica(address, tls, stream_interval, transport) for address in addresses]
        self.poll_interval = poll_interval
        self._round_robin = itertools.count()
        self._poller: asyncio.Task | None = None

    async def start(self) -> None:
        """Polls every replica once, then keeps polling in the background."""
        await self.poll()
        self._poller = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for replica in self.replicas:
            await replica.stream.close()
        await asyncio.gather(*(replica.channel.close() for replica in self.replicas))

    async def poll(self) -> None:
        await asyncio.gather(*(replica.poll(timeout=max(self.poll_interval, 1.0))
                               for replica in self.replicas))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            await self.poll()

    @property
    def any_healthy(self) -> bool:
        return any(replica.healthy for replica in self.replicas)

    def max_model_len(self) -> int | None:
        """The smallest context length the replicas report (None before any report)."""
        lengths = [r.load.max_model_len for r in self.replicas if r.load.max_model_len > 0]
        return min(lengths) if lengths else None

    def pick(self, exclude: set[Replica] = frozenset(), prefer: Replica | None = None) -> Replica | None:
        """The least-loaded healthy replica not in `exclude` (`prefer` when it is healthy and not excluded);
        an unhealthy one only when no healthy one is left."""
        if prefer is not None and prefer.healthy and prefer not in exclude:
            return prefer
        candidates = [r for r in self.replicas if r not in exclude]
        healthy = [r for r in candidates if r.healthy]
        pool = healthy or candidates
        if not pool:
            return None
        start = next(self._round_robin) % len(pool)
        rotated = pool[start:] + pool[:start]  # equal scores alternate between replicas
        return min(rotated, key=Replica.score)

    async def generate(self, request_id: str, request: GenerationRequest, deadline: float | None = None,
                       pin: ReplicaPin | None = None) -> AsyncIterator[VerifierChunk]:
        """The verifier's steps for `request`; `deadline` is an event-loop time (None = none); calls with the
        same `pin` go where its first one went.

        Close the iterator (e.g. `contextlib.aclosing`) to cancel the downstream call early.
        """
        progress = StreamProgress(request)
        message = convert.verifier_request(request_id, request)
        tried: set[Replica] = set()
        last_error = UpstreamError(grpc.StatusCode.UNAVAILABLE, "no verifier replica could take the request")
        while True:
            replica = self.pick(exclude=tried, prefer=pin.replica if pin is not None else None)
            if replica is None:
                raise last_error
            if pin is not None and pin.replica is None:
                pin.replica = replica
            tried.add(replica)
            try:
                async for chunk in self._call(replica, message, deadline):
                    yield progress.record(chunk)
                return
            except UpstreamError as error:
                resumed = progress.resume() if error.code in RETRYABLE_CODES else None
                if resumed is None:
                    raise
                last_error = error
                message = convert.verifier_request(request_id, resumed)
                logger.warning("verifier %s failed (%s) after %d tokens; resuming on another replica",
                               replica.address, error.code.name, len(progress.emitted))

    async def _call(self, replica: Replica, message, deadline: float | None) -> AsyncIterator[VerifierChunk]:
        timeout = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if timeout is not None and timeout <= 0:
            raise UpstreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded before dispatch")
        updates = replica.stream.start(message, timeout)
        replica.in_flight += 1
        pending: list = []  # updates taken and not yet handled
        try:
            while True:
                if not pending and deadline is None:
                    pending = await updates.take()
                elif not pending:
                    async with asyncio.timeout_at(deadline):
                        pending = await updates.take()
                update = pending.pop(0)
                # Steps that piled up while this request's stream was busy go on as one: one detokenize, one
                # event, one write for all of them, so a loaded gateway does less work a token, not more.
                while (isinstance(update, VerifierChunk) and not update.finish_reason and pending
                       and isinstance(pending[0], VerifierChunk)):
                    update = update.then(pending.pop(0))
                if isinstance(update, UpstreamError):
                    if update.code == grpc.StatusCode.UNAVAILABLE:
                        replica.healthy = False  # until the next poll says otherwise
                    raise update
                yield update
                if update.finish_reason:
                    return
        except TimeoutError:
            raise UpstreamError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"verifier {replica.address}: deadline exceeded") from None
        finally:
            replica.in_flight -= 1
            replica.stream.abort(message.request_id)  # a no-op when it finished; stops it when we stop early
