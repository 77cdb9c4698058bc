"""Bad input over gRPC and HTTP: a clear error naming the field, and no effect on a request running beside it."""
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from support.small_stack import CONTEXT, VOCAB_SIZE as VOCAB
from specd.v1 import common_pb2, gateway_pb2, verifier_pb2, verifier_pb2_grpc
from support.e2e_clients import generate

LONG_PROMPT = "word " * (CONTEXT + 10)
HUGE_PROMPT = "x" * (8 * 2**20)  # refused without tokenizing 8 MB

# (GenerateRequest fields, the field the error must name)
GRPC_CASES = [
    (dict(prompt=""), "prompt"),
    (dict(prompt=LONG_PROMPT), "prompt"),
    (dict(prompt=HUGE_PROMPT), "prompt"),
    (dict(prompt="Hi", max_tokens=0), "max_tokens"),
    (dict(prompt="Hi", max_tokens=-5), "max_tokens"),
    (dict(prompt="Hi", max_tokens=2**31 - 1), "max_tokens"),
    (dict(prompt="Hi", temperature=-0.5), "temperature"),
    (dict(prompt="Hi", temperature=float("nan")), "temperature"),
    (dict(prompt="Hi", top_p=0.0), "top_p"),
    (dict(prompt="Hi", top_p=1.5), "top_p"),
    (dict(prompt="Hi", top_k=-7), "top_k"),
    (dict(prompt_token_ids=[1, VOCAB]), "prompt_token_ids"),
    (dict(prompt_token_ids=[-1, 5]), "prompt_token_ids"),
    (dict(prompt="Hi", prompt_token_ids=[1, 2]), "prompt"),
    (dict(prompt="Hi", num_speculative_tokens=-1), "num_speculative_tokens"),
    (dict(prompt="Hi", stop=[""]), "stop"),
    (dict(prompt="Hi", presence_penalty=3.0), "presence_penalty"),
    (dict(prompt="Hi", logit_bias={VOCAB: 1.0}), f"logit_bias[{VOCAB}]"),
]

# (JSON body of /v1/completions, the `param` the 400 must name)
HTTP_CASES = [
    ({"model": "default", "prompt": ""}, "prompt"),
    ({"model": "default", "prompt": LONG_PROMPT}, "prompt"),
    ({"model": "default", "prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"model": "default", "prompt": "Hi", "max_tokens": 10**30}, "max_tokens"),
    ({"model": "default", "prompt": "Hi", "temperature": -1}, "temperature"),
    ({"model": "default", "prompt": "Hi", "top_p": 0}, "top_p"),
    ({"model": "default", "prompt": "Hi", "top_p": 1.01}, "top_p"),
    ({"model": "default", "prompt": "Hi", "top_k": -3}, "top_k"),
    ({"model": "default", "prompt": "Hi", "top_k": 10**12}, "top_k"),
    ({"model": "default", "prompt": "Hi", "num_speculative_tokens": 10**12}, "num_speculative_tokens"),
    ({"model": "default", "prompt": [1, VOCAB + 5]}, "prompt"),
    ({"model": "default", "prompt": "Hi", "max_tokens": "many"}, "max_tokens"),
    ({"model": "gpt-5", "prompt": "Hi"}, "model"),
    ({"prompt": "Hi"}, "model"),
    ({"model": "default", "prompt": "Hi", "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"model": "default", "prompt": "Hi", "logit_bias": {str(VOCAB): 1}}, f'logit_bias["{VOCAB}"]'),
]


@pytest.fixture(scope="module")
def bystander(small_stack):
    """A long greedy request running beside the bad ones; the module checks it completed unharmed."""
    expected = generate(small_stack.gateway_address, "Count: 1, 2, 3,", 24)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(generate, small_stack.gateway_address, "Count: 1, 2, 3,", 24)
        yield
        result = running.result(timeout=120)
    assert result.token_ids == expected.token_ids and result.finish_reason == expected.finish_reason


def grpc_error(gateway, **fields) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        list(gateway.Generate(gateway_pb2.GenerateRequest(**fields), timeout=60))
    return caught.value


@pytest.mark.parametrize("fields, field", GRPC_CASES, ids=[f for _, f in GRPC_CASES])
def test_grpc_bad_field_is_invalid_argument_naming_it(gateway, bystander, fields, field):
    error = grpc_error(gateway, **fields)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}:"), error.details()


def test_grpc_invalid_utf8_is_invalid_argument(small_stack, bystander):
    """A string field with bad UTF-8 cannot be built with the protobuf API, so it is sent as raw bytes."""
    raw_request = b"\x0a\x03\xff\xfe\xfd"  # field 1 (prompt), length 3, not UTF-8
    with grpc.insecure_channel(small_stack.gateway_address) as channel:
        call = channel.unary_stream("/specd.v1.Gateway/Generate", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as caught:
            list(call(raw_request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert "UTF-8" in caught.value.details()


def test_grpc_oversized_message_is_refused_by_size(gateway, bystander):
    error = grpc_error(gateway, prompt="y" * (65 * 2**20))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in error.details()


def test_verifier_refuses_token_ids_outside_the_vocabulary(small_stack, bystander):
    """The verifier checks on its own too: a gateway is not the only caller it can have."""
    request = verifier_pb2.VerifierGenerateRequest(request_id="bad-ids", prompt_token_ids=[3, VOCAB])
    with grpc.insecure_channel(small_stack.verifier_addresses[0]) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(verifier_pb2_grpc.VerifierStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("prompt_token_ids:")


@pytest.mark.parametrize("sampling, field", [({"logit_bias": {VOCAB: 1.0}}, f"logit_bias[{VOCAB}]"),
                                             ({"repetition_penalty": 0.0}, "repetition_penalty")])
def test_verifier_refuses_bad_penalties_itself(small_stack, bystander, sampling, field):
    request = verifier_pb2.VerifierGenerateRequest(request_id="bad-penalty", prompt_token_ids=[3, 4],
                                                   sampling=common_pb2.SamplingParams(**sampling))
    with grpc.insecure_channel(small_stack.verifier_addresses[0]) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(verifier_pb2_grpc.VerifierStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(f"{field}:")


def test_verifier_refuses_an_oversized_tenant_key(small_stack, bystander):
    request = verifier_pb2.VerifierGenerateRequest(request_id="bad-tenant", prompt_token_ids=[3, 4], tenant_key="k" * 129)
    with grpc.insecure_channel(small_stack.verifier_addresses[0]) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(verifier_pb2_grpc.VerifierStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("tenant_key:")


def test_verifier_refuses_an_output_position_offset_beyond_the_prompts_generated_tokens(small_stack, bystander):
    """output_position_offset counts generated tokens at the end of the prompt, so it is less than its length."""
    request = verifier_pb2.VerifierGenerateRequest(request_id="bad-offset", prompt_token_ids=[3, 4],
                                                   sampling=common_pb2.SamplingParams(output_position_offset=2))
    with grpc.insecure_channel(small_stack.verifier_addresses[0]) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(verifier_pb2_grpc.VerifierStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("output_position_offset:")


@pytest.mark.parametrize("body, param", HTTP_CASES, ids=[p for _, p in HTTP_CASES])
def test_http_bad_field_is_400_naming_it(small_stack, bystander, body, param):
    response = httpx.post(f"{small_stack.http_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("content, content_type, param", [
    (b'{"model": "default", "prompt": "Hi"', "application/json", "body"),
    (b'["not", "an", "object"]', "application/json", "body"),
    (b'{"model": "default", "prompt": "\xff\xfe"}', "application/json", "body"),
    (b'{"model": "default", "prompt": "Hi"}', "text/plain", "content-type"),
    (b'model=default&prompt=Hi', "application/x-www-form-urlencoded", "content-type"),
], ids=["truncated-json", "json-array", "invalid-utf8", "text-plain", "form"])
def test_http_malformed_body_is_400_naming_it(small_stack, bystander, content, content_type, param):
    response = httpx.post(f"{small_stack.http_url}/v1/completions", content=content,
                          headers={"content-type": content_type}, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_http_oversized_body_is_refused_unread(small_stack, bystander):
    """A declared 65 MiB body is refused from its headers (413): the server answers before the body is sent."""
    with socket.create_connection(("127.0.0.1", small_stack.http_port), timeout=30) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\n"
                           b"content-type: application/json\r\ncontent-length: %d\r\n\r\n{" % (65 * 2**20))
        status_line = connection.makefile("rb").readline()
    assert status_line.split()[1] == b"413", status_line


def test_http_chat_with_huge_message_is_413(small_stack, bystander):
    """8 MiB is more JSON than the context's worth of text takes: refused as a body, before parsing it."""
    body = {"model": "default", "messages": [{"role": "user", "content": HUGE_PROMPT}]}
    response = httpx.post(f"{small_stack.http_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 413 and response.json()["error"]["param"] == "body"


def test_http_chat_too_long_for_the_context_is_400_naming_messages(small_stack, bystander):
    body = {"model": "default", "messages": [{"role": "user", "content": LONG_PROMPT}]}
    response = httpx.post(f"{small_stack.http_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
