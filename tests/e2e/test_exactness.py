"""Greedy output through the whole stack equals transformers' greedy output, speculation on and off."""
import json

import httpx
import pytest

from bench.local_stack import metric_value
from support.e2e_clients import generate
from support.e2e_clients import hf_greedy as greedy_reference

# Prompts whose continuations repeat themselves, so n-gram drafts are accepted.
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "# The same function again:\ndef fibonacci(n):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]
MAX_TOKENS = 24


@pytest.mark.parametrize("num_speculative_tokens", [0, 4, 7, 50])  # 50: clamped to the verifier's maximum, 8
@pytest.mark.parametrize("prompt", PROMPTS)
def test_grpc_greedy_equals_transformers(stack, prompt, num_speculative_tokens):
    result = generate(stack.gateway_address, prompt, MAX_TOKENS, num_speculative_tokens=num_speculative_tokens)
    # The prompts are chosen to run to max_tokens, so the whole continuation is compared.
    assert result.finish_reason == "length"
    assert result.token_ids == list(greedy_reference(prompt, MAX_TOKENS))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_usage_counts_are_consistent(stack, prompt):
    result = generate(stack.gateway_address, prompt, MAX_TOKENS, num_speculative_tokens=4)
    usage = result.usage
    assert usage.completion_tokens == len(result.token_ids)
    assert usage.accepted_tokens <= usage.draft_tokens
    assert 1 <= usage.steps <= usage.completion_tokens
    # Each step emits its accepted drafts plus exactly one token of the target model's own.
    assert usage.completion_tokens <= usage.steps + usage.accepted_tokens
    assert usage.prompt_tokens > 0
    assert usage.num_speculative_tokens == 4


def test_a_larger_ask_than_the_maximum_is_clamped_and_reported(stack):
    result = generate(stack.gateway_address, PROMPTS[0], MAX_TOKENS, num_speculative_tokens=50)
    assert result.usage.num_speculative_tokens == 8  # the verifiers' default maximum
    assert result.usage.draft_tokens <= 8 * result.usage.steps


def test_speculation_accepts_drafts_on_repetitive_text(stack):
    result = generate(stack.gateway_address, PROMPTS[0], MAX_TOKENS, num_speculative_tokens=4)
    assert result.usage.accepted_tokens > 0
    assert result.usage.steps < result.usage.completion_tokens


def test_no_speculation_scores_no_drafts(stack):
    result = generate(stack.gateway_address, PROMPTS[0], MAX_TOKENS, num_speculative_tokens=0)
    assert result.usage.draft_tokens == 0
    assert result.usage.steps == result.usage.completion_tokens


@pytest.mark.parametrize("num_speculative_tokens", [0, 4])
def test_steps_are_scheduled_ahead_and_output_is_unchanged(stack, num_speculative_tokens):
    """This stack's verifiers run with --async-scheduling on: each step is launched before the previous step's
    tokens reached the host (with drafts too: guessed from a proposal covering the step in flight), and the
    output still equals transformers."""
    def scheduled_ahead() -> float:
        return sum(metric_value(stack.metrics_url(f"verifier-{i}"), "specd_steps_scheduled_ahead_total")
                   for i in range(len(stack.verifier_addresses)))

    before = scheduled_ahead()
    result = generate(stack.gateway_address, PROMPTS[1], MAX_TOKENS, num_speculative_tokens=num_speculative_tokens)
    assert result.token_ids == list(greedy_reference(PROMPTS[1], MAX_TOKENS))
    # Export runs after each step's outputs are delivered: the last step or two may not be counted yet.
    assert scheduled_ahead() >= before + result.usage.steps // 2


@pytest.mark.parametrize("num_speculative_tokens", [0, 4])
def test_http_completion_equals_grpc(stack, num_speculative_tokens):
    prompt = PROMPTS[0]
    grpc_result = generate(stack.gateway_address, prompt, MAX_TOKENS, num_speculative_tokens=num_speculative_tokens)
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "num_speculative_tokens": num_speculative_tokens}
    reply = httpx.post(f"{stack.http_url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    completion = reply.json()
    assert completion["choices"][0]["text"] == grpc_result.text
    assert completion["usage"]["completion_tokens"] == grpc_result.usage.completion_tokens
    speculative = completion["usage"]["speculative"]
    assert speculative["accepted_tokens"] <= speculative["draft_tokens"]


def test_http_streaming_equals_grpc(stack):
    prompt = PROMPTS[1]
    grpc_result = generate(stack.gateway_address, prompt, MAX_TOKENS)
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, usage = [], None
    with httpx.stream("POST", f"{stack.http_url}/v1/completions", json=body, timeout=120) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        event = json.loads(line[len("data: "):])
        chunks += [choice["text"] for choice in event["choices"]]
        usage = event.get("usage") or usage
    assert "".join(chunks) == grpc_result.text
    assert usage["completion_tokens"] == len(grpc_result.token_ids)
