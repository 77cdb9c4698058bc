"""Property-based fuzzing of request fields against the running gateway, over gRPC and HTTP.

Whatever a client sends, the answer is a result or a client error (INVALID_ARGUMENT / 400): never
INTERNAL / 5xx, never a hung call, never a dead process. Generations are kept short (max_tokens is
drawn small or out of range) so each property runs in seconds.
"""
import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specd.v1 import gateway_pb2
from support.e2e_clients import generate
from support.small_stack import CONTEXT, VOCAB_SIZE

FUZZ = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CALL_TIMEOUT = 60.0  # far above any generation drawn here: hitting it means a stuck request

INT32 = st.integers(-2**31, 2**31 - 1)
FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=32)
MAX_TOKENS = st.one_of(st.integers(-3, 6), st.integers(max_value=0, min_value=-2**31),
                       st.integers(min_value=CONTEXT, max_value=2**31 - 1))
TOKEN_IDS = st.lists(st.one_of(st.integers(0, VOCAB_SIZE - 1), INT32), max_size=12)
TEXT = st.text(max_size=60)

GRPC_FIELDS = st.fixed_dictionaries({"max_tokens": MAX_TOKENS}, optional={
    "prompt": TEXT, "prompt_token_ids": TOKEN_IDS, "temperature": FLOAT, "top_p": FLOAT,
    "top_k": INT32, "min_p": FLOAT, "seed": st.integers(-2**63, 2**63 - 1),
    "stop": st.lists(TEXT, max_size=3), "ignore_eos": st.booleans(), "num_speculative_tokens": INT32,
    "logprobs": st.one_of(st.integers(-2, 22), INT32), "logprobs_mode": st.integers(-1, 3),
})

JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON_VALUE = st.recursive(JSON_SCALAR, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)
HTTP_BODY = st.fixed_dictionaries({"max_tokens": st.one_of(MAX_TOKENS, JSON_VALUE)}, optional={
    "model": st.one_of(st.just("default"), JSON_VALUE), "prompt": st.one_of(TEXT, TOKEN_IDS, JSON_VALUE),
    "temperature": st.one_of(st.floats(-2, 3), JSON_VALUE), "top_p": st.one_of(st.floats(-1, 2), JSON_VALUE),
    "top_k": st.one_of(INT32, JSON_VALUE), "seed": st.one_of(st.integers(-2**64, 2**64), JSON_VALUE),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3), JSON_VALUE), "stream": st.booleans(),
    "n": JSON_VALUE, "num_speculative_tokens": st.one_of(INT32, JSON_VALUE),
    "stream_options": JSON_VALUE, "messages": JSON_VALUE,
    "logprobs": st.one_of(st.integers(-2, 22), JSON_VALUE), "top_logprobs": st.one_of(st.integers(-2, 22), JSON_VALUE),
    "logprobs_mode": st.one_of(st.sampled_from(["raw", "processed"]), JSON_VALUE),
})


@pytest.fixture(scope="module")
def still_healthy_after(small_stack):
    """After the module: every process is alive and a greedy request still answers as before."""
    before = generate(small_stack.gateway_address, "The capital of France is", 8)
    yield
    assert all(s.process.poll() is None for s in small_stack.services.values()), small_stack.logs()
    assert generate(small_stack.gateway_address, "The capital of France is", 8).token_ids == before.token_ids


@FUZZ
@given(fields=GRPC_FIELDS)
def test_grpc_generate_answers_a_result_or_invalid_argument(gateway, still_healthy_after, fields):
    try:
        request = gateway_pb2.GenerateRequest(**fields)
    except ValueError:  # not representable on the wire (e.g. a float32 overflow): no call to make
        return
    try:
        responses = list(gateway.Generate(request, timeout=CALL_TIMEOUT))
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (fields, error.code(), error.details())
        assert ":" in error.details()  # "field: why"
        return
    assert responses and responses[-1].finish_reason in ("stop", "length"), fields


@FUZZ
@given(body=HTTP_BODY, chat=st.booleans())
def test_http_completions_answer_200_or_400(small_stack, still_healthy_after, body, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    response = httpx.post(small_stack.http_url + path, json=body, timeout=CALL_TIMEOUT)
    assert response.status_code in (200, 400), (body, response.status_code, response.text[:300])
    if response.status_code == 400:
        assert response.json()["error"]["param"], response.text
    elif body.get("stream") is True:
        assert response.text.rstrip().endswith("data: [DONE]"), response.text[-300:]


@settings(FUZZ, max_examples=25)
@given(raw=st.binary(max_size=48))
def test_grpc_generate_of_arbitrary_bytes_answers_a_result_or_invalid_argument(small_stack, still_healthy_after, raw):
    """Bytes that are no valid GenerateRequest (bad UTF-8, broken varints) are refused, not crashed on."""
    with grpc.insecure_channel(small_stack.gateway_address) as channel:
        call = channel.unary_stream("/specd.v1.Gateway/Generate", request_serializer=lambda b: b,
                                    response_deserializer=gateway_pb2.GenerateResponse.FromString)
        try:
            responses = list(call(raw, timeout=CALL_TIMEOUT))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (raw, error.code(), error.details())
            return
    assert responses and responses[-1].finish_reason in ("stop", "length"), raw
