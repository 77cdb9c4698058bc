"""Verifier.Serve over a real gRPC server on loopback, and the same stream over the verifier's Serve socket: many
requests on one stream, a step's news in one message, refusals answered on the stream with the status Generate would
give, aborts, deadlines, the stream's end and drain."""
from __future__ import annotations

import asyncio

import grpc
import pytest
import pytest_asyncio

from gateway.serve_socket import SocketCall
from support.fake_runner import FakePagedRunner, greedy_reference
from specd.serve_socket import client_ssl
from specd.serving import GrpcServer, ServerConfig, TlsConfig, open_channel
from support.tls_certs import TestCertificateAuthority
from specd.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.convert import ModelLimits
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine_loop import EngineLoop
from verifier_service.serve_socket import ServeSocket
from verifier_service.service import VerifierServicer

VOCAB = 32
MAX_WAITING = 4
pytestmark = pytest.mark.asyncio(loop_scope="session")


class SocketServe:
    """The gateway's Serve socket call (gateway/serve_socket.py, plain TCP to `port` unless a call is given) with the
    grpc.aio call's `read`."""

    def __init__(self, port: int = 0, call: SocketCall | None = None) -> None:
        self.call = call or SocketCall("127.0.0.1", port, None)
        self.write, self.cancel, self._responses = self.call.write, self.call.cancel, aiter(self.call)

    async def read(self):
        return await anext(self._responses, grpc.aio.EOF)


class Verifier:
    """A real servicer and engine loop (fake model) behind a real server and a real Serve socket."""

    def __init__(self, transport: str) -> None:
        self.transport = transport

    def serve(self):
        """A Serve call over this fixture's transport."""
        return self.stub.Serve() if self.transport == "grpc" else SocketServe(self.serve_socket.port)

    async def start(self) -> "Verifier":
        runner = FakePagedRunner(num_blocks=400, block_size=4, vocab_size=VOCAB, max_model_len=1024)
        self.loop = EngineLoop(Engine(EngineConfig(num_speculative_tokens=0, max_num_seqs=2), runner=runner))
        self.first_tokens: list[float] = []  # the servicer's time to first token, seconds per request
        self.servicer = VerifierServicer(max_waiting_requests=MAX_WAITING, first_token=self.first_tokens.append)
        self.server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_seconds=5),
                                 service_names=["specd.v1.Verifier"], on_drain=self.servicer.drain,
                                 register=lambda s: verifier_pb2_grpc.add_VerifierServicer_to_server(self.servicer, s))
        await self.server.start()
        self.serve_socket = await ServeSocket(self.servicer.serve).start("127.0.0.1", 0, None)
        self.loop.start()
        self.servicer.attach(self.loop, ModelLimits("fake", 1024, VOCAB))
        await self.server.mark_ready()
        self.channel = open_channel(f"127.0.0.1:{self.server.port}")
        self.stub = verifier_pb2_grpc.VerifierStub(self.channel)
        return self

    async def stop(self) -> None:
        self.serve_socket.close()
        await self.channel.close()
        await self.server.stop(0)
        self.loop.stop()


@pytest_asyncio.fixture(loop_scope="session", params=["grpc", "socket"])
async def verifier(request):
    verifier = await Verifier(request.param).start()
    yield verifier
    await verifier.stop()


def start(request_id: str, prompt=(1, 2, 3), max_tokens: int = 8, timeout: float = 0.0,
          **sampling) -> verifier_pb2.ServeStart:
    params = common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    return verifier_pb2.ServeStart(request=verifier_pb2.VerifierGenerateRequest(
        request_id=request_id, prompt_token_ids=list(prompt), sampling=params), timeout_seconds=timeout)


async def collect(call, until: set[str]) -> tuple[dict[str, list[int]], dict[str, tuple[int, str]], list]:
    """Tokens and errors per request, read until every id of `until` has finished or failed; and the messages."""
    tokens: dict[str, list[int]] = {}
    errors: dict[str, tuple[int, str]] = {}
    messages = []
    while until - set(errors) - {r for r, t in tokens.items() if r in finished_ids(messages)}:
        response = await asyncio.wait_for(call.read(), 10)
        messages.append(response)
        position = 0
        for index, request_id in enumerate(response.request_ids):
            count = response.token_counts[index]
            tokens.setdefault(request_id, []).extend(response.token_ids[position:position + count])
            position += count
            if index in response.errors:
                errors[request_id] = (response.errors[index].code, response.errors[index].message)
    return tokens, errors, messages


def finished_ids(messages) -> set[str]:
    return {request_id for message in messages
            for request_id, reason in zip(message.request_ids, message.finish_reasons) if reason}


async def test_requests_of_one_stream_share_each_steps_message(verifier):
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("a", (1, 2, 3)), start("b", (4, 5))]))
    tokens, errors, messages = await collect(call, {"a", "b"})
    assert not errors
    assert tokens == {"a": greedy_reference([1, 2, 3], 8, VOCAB), "b": greedy_reference([4, 5], 8, VOCAB)}
    assert any(set(m.request_ids) == {"a", "b"} for m in messages)  # one message carried both requests' step
    last = messages[-1]
    index = list(last.request_ids).index("b")
    assert (last.completion_tokens[index], last.finish_reasons[index]) == (8, "length")
    call.cancel()


async def test_each_request_reports_its_time_to_first_token_once(verifier):
    """Serve's requests and a Generate call: one observation each, when its first tokens leave; none for a
    refused start."""
    before = len(verifier.first_tokens)
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("t1"), start("t2", (4, 5)), start("t3", (1, VOCAB + 5))]))
    await collect(call, {"t1", "t2", "t3"})
    call.cancel()
    async for _ in verifier.stub.Generate(start("t4").request):
        pass
    observed = verifier.first_tokens[before:]
    assert len(observed) == 3 and all(0 < seconds < 10 for seconds in observed)


async def test_a_request_whose_first_update_is_its_last_reports_its_first_token_and_its_seed(verifier):
    """A one-token request (or any that finishes before the stream sends its first message) is forgotten by the stream
    as its last update goes out: its first-token time and its seed must go out first."""
    before = len(verifier.first_tokens)
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("one", max_tokens=1, temperature=1.0)]))
    _, _, messages = await collect(call, {"one"})
    call.cancel()
    assert len(verifier.first_tokens) == before + 1
    first = messages[0]
    assert list(first.request_ids) == ["one"] and 0 in first.seeds  # an unseeded sampled request gets one


async def test_a_bad_start_is_refused_by_name_and_the_others_run(verifier):
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("bad", (1, VOCAB + 5)), start("good")]))
    tokens, errors, _ = await collect(call, {"bad", "good"})
    assert errors == {"bad": (grpc.StatusCode.INVALID_ARGUMENT.value[0], errors["bad"][1])}
    assert errors["bad"][1].startswith("prompt_token_ids")
    assert tokens["good"] == greedy_reference([1, 2, 3], 8, VOCAB)
    call.cancel()


async def test_a_full_queue_is_resource_exhausted_and_a_live_id_already_exists(verifier):
    """Two requests run (max_num_seqs 2); MAX_WAITING more may wait; beyond that, starts are refused."""
    call = verifier.serve()
    running = [start(f"run{i}", max_tokens=1000) for i in range(2)]
    waiting = [start(f"wait{i}", max_tokens=1000) for i in range(MAX_WAITING + 2)]
    await call.write(verifier_pb2.ServeRequest(starts=running))
    await wait_for(lambda: verifier.loop.load.num_running == 2)
    await call.write(verifier_pb2.ServeRequest(starts=[start("run0")] + waiting))
    _, errors, _ = await collect(call, {"wait4", "wait5"})
    assert {request_id: code for request_id, (code, _) in errors.items()} == {
        "wait4": grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "wait5": grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
        "run0": grpc.StatusCode.ALREADY_EXISTS.value[0]}
    # The first still runs, the admitted ones wait (the load counts them once the engine thread took them).
    await wait_for(lambda: verifier.loop.load.num_running + verifier.loop.load.num_waiting == 2 + MAX_WAITING)
    call.cancel()


async def test_an_abort_and_the_streams_end_free_the_engine(verifier):
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("x", max_tokens=500), start("y", max_tokens=500)]))
    await call.read()
    await call.write(verifier_pb2.ServeRequest(abort_request_ids=["x"]))
    await wait_for(lambda: verifier.loop.load.num_running == 1)
    call.cancel()  # the gateway is gone: what the stream still runs is aborted
    await wait_for(lambda: verifier.loop.load.num_running == 0 and verifier.loop.load.num_used_blocks == 0)


async def test_a_request_past_its_timeout_is_aborted_and_answered_deadline_exceeded(verifier):
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("slow", max_tokens=1000, timeout=0.2)]))
    _, errors, _ = await collect(call, {"slow"})
    assert errors["slow"][0] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    await wait_for(lambda: verifier.loop.load.num_running == 0)
    call.cancel()


async def test_a_draining_verifier_refuses_new_starts_and_ends_the_stream_when_its_requests_have(verifier):
    call = verifier.serve()
    await call.write(verifier_pb2.ServeRequest(starts=[start("running", max_tokens=40)]))
    await call.read()
    verifier.servicer.drain()
    await call.write(verifier_pb2.ServeRequest(starts=[start("late")]))
    tokens, errors, _ = await collect(call, {"running", "late"})
    assert errors["late"][0] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "running" not in errors
    assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF  # nothing live: the stream ended
    if verifier.transport == "grpc":  # (a socket has no status: it ends by closing, as read() just saw)
        assert await call.code() == grpc.StatusCode.OK


async def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


# The Serve socket's own cases (each on a verifier of its own: the fixture's has drained): TLS as the gRPC port's, a
# verifier still loading, a peer that is not a gateway.

async def test_the_serve_socket_over_mutual_tls_serves_a_gateway_with_a_certificate_and_refuses_one_without(
        tmp_path):
    authority = TestCertificateAuthority(tmp_path)
    server, client = authority.issue("server", server=True), authority.issue("gateway", server=False, client=True)
    verifier = await Verifier("socket").start()
    tls_socket = await ServeSocket(verifier.servicer.serve).start(
        "127.0.0.1", 0, TlsConfig(server.cert_path, server.key_path, authority.ca_path))
    port = tls_socket.port
    try:
        call = SocketCall("localhost", port, client_ssl(TlsConfig(client.cert_path, client.key_path,
                                                                  authority.ca_path)))
        await call.write(verifier_pb2.ServeRequest(starts=[start("tls", max_tokens=3)]))
        tokens, errors, _ = await collect(SocketServe(call=call), {"tls"})
        assert not errors and len(tokens["tls"]) == 3
        call.cancel()
        anonymous = SocketServe(call=SocketCall("localhost", port, client_ssl(TlsConfig(ca_path=authority.ca_path))))
        with pytest.raises((OSError, asyncio.IncompleteReadError)):  # the handshake fails or the server hangs up
            await anonymous.write(verifier_pb2.ServeRequest(starts=[start("anonymous")]))
            await asyncio.wait_for(anonymous.read(), 10)
    finally:
        tls_socket.close()
        await verifier.stop()


async def test_a_serve_socket_connection_before_the_model_is_loaded_is_closed_at_once():
    servicer = VerifierServicer(max_waiting_requests=MAX_WAITING)
    serve_socket = await ServeSocket(servicer.serve).start("127.0.0.1", 0, None)
    try:
        call = SocketServe(serve_socket.port)
        await call.write(verifier_pb2.ServeRequest(starts=[start("early")]))
        assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF  # the gateway fails it UNAVAILABLE
    finally:
        serve_socket.close()


async def test_a_serve_socket_peer_sending_garbage_is_cut_off_and_its_requests_aborted():
    verifier = await Verifier("socket").start()
    try:
        call = verifier.serve()
        await call.write(verifier_pb2.ServeRequest(starts=[start("doomed", max_tokens=500)]))
        assert (await asyncio.wait_for(call.read(), 10)).request_ids == ["doomed"]  # it runs
        _, writer = await call.call._connected
        writer.write(b"\xff\xff\xff\xff" + b"x" * 16)  # a 4 GiB frame: over the limit
        while (message := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
            assert not message.errors
        await wait_for(lambda: verifier.loop.load.num_running + verifier.loop.load.num_waiting == 0)
        assert verifier.loop.load.num_used_blocks == 0
    finally:
        await verifier.stop()
