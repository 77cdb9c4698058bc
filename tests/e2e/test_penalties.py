"""Penalties and logit bias through the whole stack (the real drafter, async scheduling on): speculation gives the
tokens it gives without, and logit_bias forces or bans a token over the real HTTP API."""
import httpx
import pytest
from transformers import AutoTokenizer

from specd.default_model import resolve_model_path
from support.e2e_clients import generate

# Text that repeats itself, so n-gram drafts are proposed, and penalties have repeats to act on.
PROMPT = ("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
          "The quick brown fox")
MAX_TOKENS = 24
PENALTIES = {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.2}


def completion(stack, **fields) -> dict:
    body = {"model": "default", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    response = httpx.post(f"{stack.http_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("kind", ["penalties", "bias"])
def test_speculation_gives_the_tokens_it_gives_without(stack, kind):
    plain = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=0)
    fields = PENALTIES if kind == "penalties" else {"logit_bias": {plain.token_ids[4]: -5.0, plain.token_ids[9]: -5.0}}
    without = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=0, **fields)
    assert without.token_ids != plain.token_ids  # the adjustment does change the output
    for k in (2, 6):
        result = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=k, **fields)
        assert result.token_ids == without.token_ids, f"k = {k}"
        assert result.usage.draft_tokens > 0


def test_http_penalties_give_the_grpc_tokens(stack):
    expected = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=4, **PENALTIES)
    assert completion(stack, **PENALTIES)["choices"][0]["text"] == expected.text


def test_a_logit_bias_of_100_forces_the_token(stack):
    [token] = AutoTokenizer.from_pretrained(resolve_model_path("default")).encode(" banana")
    forced = generate(stack.gateway_address, PROMPT, 6, logit_bias={token: 100.0})
    assert forced.token_ids == [token] * 6
    text = completion(stack, max_tokens=6, logit_bias={str(token): 100})["choices"][0]["text"]
    assert text == forced.text


def test_a_logit_bias_of_minus_100_bans_the_token(stack):
    plain = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=4)
    banned = plain.token_ids[0]
    result = generate(stack.gateway_address, PROMPT, MAX_TOKENS, logit_bias={banned: -100.0})
    assert banned not in result.token_ids
    http = completion(stack, logit_bias={str(banned): -100})["choices"][0]["text"]
    assert http == result.text != plain.text
