"""SIGTERM on a verifier (a rolling update): it stops taking new work, lets live streams finish within its
drain, then ends the rest and exits 0 (issue 17, item 2)."""
import asyncio
import signal
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.local_stack import REPO_ROOT, Service, Stack, free_port, wait_serving
from specd.serving import open_channel
from specd.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc

DRAIN_SECONDS = 6.0  # the short stream's one more step fits easily, even on a busy 2-core box


@pytest.fixture
def verifier(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "specd_cli", "verifier", "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(free_port()), "--device", "cpu", "--drafter-addr", "none",
            "--drain-seconds", str(DRAIN_SECONDS)]
    service = Service("verifier", argv, port, 0, tmp_path / "verifier.log")
    service.launch(Stack().env)
    wait_serving(service.address, service.process, service.log_path)
    yield service
    service.stop(signal.SIGKILL)


def generate(stub, request_id: str, max_tokens: int):
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return stub.Generate(verifier_pb2.VerifierGenerateRequest(
        request_id=request_id, prompt_token_ids=[1, 2, 3, 4, 5], sampling=sampling))


async def until_not_serving(channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    while True:
        try:
            if (await stub.Check(health_pb2.HealthCheckRequest())).status != health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            return
        await asyncio.sleep(0.02)


async def drain(verifier: Service) -> None:
    async with open_channel(verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        short, long = generate(stub, "short", 2), generate(stub, "long", 3000)
        await short.read(), await long.read()  # both live
        signalled = time.monotonic()
        verifier.process.send_signal(signal.SIGTERM)
        await until_not_serving(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await generate(stub, "late", 4).read()
        # grpc refuses a call arriving as the drain begins with CANCELLED, later ones with UNAVAILABLE; the
        # gateway takes both elsewhere (gateway/router.py RETRYABLE_CODES).
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        while not (message := await short.read()).finish_reason:
            pass
        assert message.finish_reason == "length"  # the live stream that could finish did
        with pytest.raises(grpc.aio.AioRpcError):
            while await long.read() != grpc.aio.EOF:
                pass
        assert DRAIN_SECONDS - 0.5 < time.monotonic() - signalled < DRAIN_SECONDS + 5


def test_sigterm_finishes_live_streams_refuses_new_ones_and_ends_the_rest_at_the_drain(verifier):
    asyncio.run(drain(verifier))
    assert verifier.process.wait(timeout=10) == 0
