"""Security on real processes: TLS + mutual TLS on every gRPC link and on HTTPS, API keys at the
gateway, and prompts / outputs kept out of the logs unless --log-requests asks for them."""
import ssl

import grpc
import httpx
import pytest

from bench.local_stack import Stack
from specd.serving import TlsConfig, open_channel
from specd.v1 import drafter_pb2, drafter_pb2_grpc, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from support.tls_certs import TestCertificateAuthority

API_KEY = "sk-reliability-test-key"
SECRET_PROMPT = "The launch code of project Marmalade is"  # must never reach a log by default
REPEATING_PROMPT = "a b c d a b c d a b c d a b c d a b c"  # drafts get accepted: the drafter link works


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    return TestCertificateAuthority(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def client_tls(authority) -> TlsConfig:
    client = authority.issue("client", server=False)
    return TlsConfig(client.cert_path, client.key_path, authority.ca_path)


@pytest.fixture(scope="module")
def stack(authority, client_tls):
    service = authority.issue("service", server=True, client=True)  # each service also dials the next
    tls_args = ("--tls-cert", service.cert_path, "--tls-key", service.key_path, "--tls-ca", authority.ca_path)
    stack = Stack(num_verifiers=1, client_tls=client_tls,
                  extra_args=("--device", "cpu", "--dtype", "float32", "--api-key", API_KEY, *tls_args)).start()
    yield stack
    stack.stop_cleanly()


def grpc_generate(stack, tls: TlsConfig | None, prompt: str, key: str | None = API_KEY, max_tokens: int = 16):
    metadata = [("authorization", f"Bearer {key}")] if key else []
    request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0)
    with open_channel(stack.gateway_address, tls, asynchronous=False) as channel:
        return list(gateway_pb2_grpc.GatewayStub(channel).Generate(request, metadata=metadata, timeout=60))


def https_post(stack, client_tls: TlsConfig, body: dict, key: str | None = API_KEY, cert=True) -> httpx.Response:
    context = ssl.create_default_context(cafile=client_tls.ca_path)
    if cert:
        context.load_cert_chain(client_tls.cert_path, client_tls.key_path)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    url = f"https://127.0.0.1:{stack.http_port}/v1/completions"
    return httpx.post(url, json=body, headers=headers, verify=context, timeout=60)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_grpc_over_mtls_with_the_key_generates_with_drafts(stack, client_tls):
    responses = grpc_generate(stack, client_tls, REPEATING_PROMPT, max_tokens=24)
    assert responses[-1].finish_reason in ("stop", "length")
    assert responses[-1].usage.accepted_tokens > 0  # verifier -> drafter over mTLS works too


def test_https_with_client_certificate_and_key_answers(stack, client_tls):
    response = https_post(stack, client_tls, {"model": "default", "prompt": "Hello", "max_tokens": 4})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("key", [None, "sk-wrong"], ids=["missing", "wrong"])
def test_grpc_without_the_right_key_is_unauthenticated(stack, client_tls, key):
    error = refused(lambda: grpc_generate(stack, client_tls, "Hello", key=key))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("key", [None, "sk-wrong"], ids=["missing", "wrong"])
def test_http_without_the_right_key_is_401(stack, client_tls, key):
    response = https_post(stack, client_tls, {"model": "default", "prompt": "Hello", "max_tokens": 4}, key=key)
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


def test_https_without_a_client_certificate_is_refused(stack, client_tls):
    with pytest.raises(httpx.TransportError):
        https_post(stack, client_tls, {"model": "default", "prompt": "Hello", "max_tokens": 4}, cert=False)


def test_plain_http_is_refused(stack):
    with pytest.raises(httpx.TransportError):
        httpx.post(f"http://127.0.0.1:{stack.http_port}/v1/completions", json={}, timeout=10)


def verifier_call(address: str, tls: TlsConfig | None):
    request = verifier_pb2.VerifierGenerateRequest(request_id="x", prompt_token_ids=[1, 2])
    with open_channel(address, tls, asynchronous=False) as channel:
        return list(verifier_pb2_grpc.VerifierStub(channel).Generate(request, timeout=10))


def drafter_call(address: str, tls: TlsConfig | None):
    with open_channel(address, tls, asynchronous=False) as channel:
        return list(drafter_pb2_grpc.DrafterStub(channel).Propose(iter([drafter_pb2.ProposeRequest()]), timeout=10))


@pytest.mark.parametrize("service", ["gateway", "verifier-0", "drafter"])
@pytest.mark.parametrize("how", ["no-client-certificate", "plaintext", "foreign-ca"])
def test_every_grpc_port_refuses_callers_without_a_certificate_it_trusts(stack, client_tls, authority,
                                                                          tmp_path, service, how):
    if how == "no-client-certificate":
        tls = TlsConfig(ca_path=client_tls.ca_path)
    elif how == "plaintext":
        tls = None
    else:
        stranger = TestCertificateAuthority(tmp_path, "stranger CA").issue("stranger", server=False)
        tls = TlsConfig(stranger.cert_path, stranger.key_path, client_tls.ca_path)
    address = stack.services[service].address
    call = {"gateway": lambda: grpc_generate(stack, tls, "Hello"),
            "verifier-0": lambda: verifier_call(address, tls),
            "drafter": lambda: drafter_call(address, tls)}[service]
    assert refused(call).code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails


def test_prompts_and_outputs_stay_out_of_the_logs_by_default(stack, client_tls):
    output = "".join(r.text for r in grpc_generate(stack, client_tls, SECRET_PROMPT))
    https_post(stack, client_tls, {"model": "default", "prompt": SECRET_PROMPT, "max_tokens": 16})
    logs = {name: s.log_path.read_text() for name, s in stack.services.items()}
    assert output.strip()
    for name, log in logs.items():
        assert SECRET_PROMPT not in log and output.strip() not in log, f"{name} logged a request"


def test_log_requests_puts_them_in_the_gateway_log(stack, client_tls):
    """The flag works, so the test above would have seen a logged prompt.

    Last in the module: it leaves the gateway running with --log-requests (the stack stops after it)."""
    gateway = stack.services["gateway"]
    gateway.stop()
    gateway.argv.append("--log-requests")
    stack.restart("gateway")
    grpc_generate(stack, client_tls, SECRET_PROMPT)
    assert SECRET_PROMPT in gateway.log_path.read_text()
