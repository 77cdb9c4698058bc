"""The tenant key: derived from the bearer token and the x-specd-tenant header, sent to the verifier as a
digest (never the key), over both front ends (real gRPC and HTTP servers, a scripted verifier)."""
import httpx
import pytest
import pytest_asyncio

from gateway.tenant import TENANT_HEADER, tenant_key
from specd.serving import open_channel
from specd.v1 import gateway_pb2, gateway_pb2_grpc

KEY = "sk-live-0123456789"


def test_the_key_is_a_digest_of_the_token_and_the_header():
    alice = tenant_key(f"Bearer {KEY}", None)
    assert len(alice) == 32 and int(alice, 16) >= 0 and KEY not in alice
    assert alice == tenant_key(f"Bearer {KEY}", "")  # an empty header names no tenant
    assert alice != tenant_key("Bearer other-key", None)
    assert tenant_key(f"Bearer {KEY}", "team-a") not in (alice, tenant_key(f"Bearer {KEY}", "team-b"))
    # a tenant header only names a tenant under the key that sends it
    assert tenant_key(f"Bearer {KEY}", "team-a") != tenant_key("Bearer other-key", "team-a")
    assert tenant_key(None, "team-a") == tenant_key("Basic xyz", "team-a") != ""


def test_a_request_without_token_or_header_has_no_tenant():
    assert tenant_key(None, None) == "" and tenant_key("Basic xyz", None) == ""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stub(stack):
    channel = open_channel(stack.grpc_address)
    yield gateway_pb2_grpc.GatewayStub(channel)
    await channel.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_grpc_calls_carry_the_digest_to_the_verifier_and_never_the_key(stub, stack):
    metadata = (("authorization", f"Bearer {KEY}"), (TENANT_HEADER, "team-a"))
    call = stub.Generate(gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=4), metadata=metadata)
    _ = [m async for m in call]
    sent = stack.verifier.requests[-1]
    assert sent.tenant_key == tenant_key(f"Bearer {KEY}", "team-a")
    assert KEY.encode() not in sent.SerializeToString()


@pytest.mark.asyncio(loop_scope="session")
async def test_http_requests_carry_the_digest_to_the_verifier(stack):
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as client:
        body = {"model": "default", "prompt": "Hi", "max_tokens": 4}
        await client.post("/v1/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert stack.verifier.requests[-1].tenant_key == tenant_key(f"Bearer {KEY}", None)
        await client.post("/v1/completions", json=body, headers={TENANT_HEADER: "team-b"})
        assert stack.verifier.requests[-1].tenant_key == tenant_key(None, "team-b")
        await client.post("/v1/completions", json=body)
        assert stack.verifier.requests[-1].tenant_key == ""
