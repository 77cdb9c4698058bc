"""Logprobs through the whole stack (async scheduling, the drafter's drafts) equal transformers' log_softmax
at the same positions within 1e-4, over gRPC and over HTTP on both endpoints, streamed and not."""
import json

import grpc
import httpx
import pytest
import torch

from gateway.tokenizer import Tokenizer
from specd.default_model import resolve_model_path
from specd.v1 import gateway_pb2, gateway_pb2_grpc
from support import reference

# A function the model copies: drafts from the context are accepted whatever the drafter's timing. (The model does
# not repeat the fox sentence that stood here: its drafts were accepted only when they came on the very first steps.)
PROMPT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
          "# The same function again:\ndef fibonacci(n):\n")
MAX_TOKENS = 16
NUM_TOP = 5
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model_path("default"))


def expected_logprobs(prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab]: transformers' log_softmax at the position of each generated token."""
    logits = reference.hf_logits(resolve_model_path("default"), prompt_ids + tokens[:-1])
    return logits[len(prompt_ids) - 1:].log_softmax(dim=-1)


def assert_close(expected: torch.Tensor, tokens: list[int], chosen: list[float], tops: list[list[float]]) -> None:
    assert len(chosen) == len(tokens) == len(tops)
    for row, token, value, top in zip(expected, tokens, chosen, tops):
        assert abs(value - float(row[token])) < TOLERANCE
        assert top == sorted(top, reverse=True)
        assert torch.allclose(torch.tensor(top), row.topk(NUM_TOP).values, atol=TOLERANCE)


def post(stack, path: str, body: dict) -> list[dict]:
    """The choices of a response; of every chunk when it streams."""
    if not body.get("stream"):
        reply = httpx.post(f"{stack.http_url}{path}", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"]
    with httpx.stream("POST", f"{stack.http_url}{path}", json=body, timeout=120) as reply:
        events = [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]
    return [choice for event in events[:-1] for choice in json.loads(event)["choices"]]


@pytest.mark.parametrize("num_speculative_tokens", [0, 4])
def test_grpc_and_completions_logprobs_equal_transformers(stack, tokenizer, num_speculative_tokens):
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=NUM_TOP,
                                          num_speculative_tokens=num_speculative_tokens)
    with grpc.insecure_channel(stack.gateway_address) as channel:
        if num_speculative_tokens:  # the stack's first drafting request opens the drafter link's stream
            list(gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120))
        messages = list(gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120))
    entries = [entry for message in messages for entry in message.logprobs]
    tokens = [entry.chosen.token_id for entry in entries]
    assert tokens == [t for message in messages for t in message.token_ids]
    if num_speculative_tokens:
        assert messages[-1].usage.accepted_tokens > 0  # some of these logprobs come from accepted drafts' rows
    expected = expected_logprobs(tokenizer.encode(PROMPT), tokens)
    assert_close(expected, tokens, [e.chosen.logprob for e in entries], [[t.logprob for t in e.top] for e in entries])
    for stream in (False, True):
        body = {"model": "default", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
                "logprobs": NUM_TOP, "num_speculative_tokens": num_speculative_tokens}
        objects = [choice["logprobs"] for choice in post(stack, "/v1/completions", body)]
        chosen = [value for obj in objects for value in obj["token_logprobs"]]
        tops = [list(top.values()) for obj in objects for top in obj["top_logprobs"]]
        assert_close(expected, tokens, chosen, tops)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_equal_transformers(stack, tokenizer, stream):
    messages = [{"role": "user", "content": "Name three colours."}]
    prompt_ids = tokenizer.encode_chat(messages)
    (continuation,) = reference.hf_greedy(resolve_model_path("default"), [prompt_ids], MAX_TOKENS)
    body = {"model": "default", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            "logprobs": True, "top_logprobs": NUM_TOP}
    content = [entry for choice in post(stack, "/v1/chat/completions", body) for entry in choice["logprobs"]["content"]]
    assert_close(expected_logprobs(prompt_ids, continuation), continuation, [e["logprob"] for e in content],
                 [[t["logprob"] for t in e["top_logprobs"]] for e in content])
