"""Through the whole stack (HTTP gateway, two async-scheduling verifiers, the drafter): a sampled request
without a seed reports the one it was given, and sending that seed back reproduces the text - with
speculation off or at another k, and among other requests."""
import json
from concurrent.futures import ThreadPoolExecutor

import httpx

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n" \
         "# The same function again, with a docstring:\ndef fibonacci(n):\n"
BODY = {"model": "default", "prompt": PROMPT, "max_tokens": 32, "temperature": 0.8, "top_p": 0.95,
        "ignore_eos": True}


def complete(url: str, **fields) -> dict:
    response = httpx.post(f"{url}/v1/completions", json={**BODY, **fields}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_reported_seed_reproduces_an_unseeded_sampled_completion(stack):
    # A completion some of whose drafts were verified and accepted. The async verifiers never wait for the
    # drafter: on a busy machine its replies can miss every step of one request, so up to three are tried.
    for _ in range(3):
        first = complete(stack.http_url)
        if first["usage"]["speculative"]["accepted_tokens"] > 0:
            break
    assert first["usage"]["speculative"]["accepted_tokens"] > 0
    seed, text = first["seed"], first["choices"][0]["text"]
    assert isinstance(seed, int) and 0 <= seed < 2**63
    assert complete(stack.http_url)["seed"] != seed  # each unseeded request draws its own
    assert complete(stack.http_url, seed=seed, num_speculative_tokens=0)["choices"][0]["text"] == text
    assert complete(stack.http_url, seed=seed, num_speculative_tokens=8)["choices"][0]["text"] == text
    with ThreadPoolExecutor(4) as pool:  # among other requests, on either replica
        crowd = list(pool.map(lambda k: complete(stack.http_url, seed=seed, num_speculative_tokens=k), [0, 2, 4, 6]))
    assert [c["choices"][0]["text"] for c in crowd] == [text] * 4
    assert {c["seed"] for c in crowd} == {seed}


def test_a_stream_reports_the_seed_on_its_first_chunk_and_reproduces_the_text(stack):
    seeded = complete(stack.http_url, seed=2024)
    with httpx.stream("POST", f"{stack.http_url}/v1/completions", json={**BODY, "seed": 2024, "stream": True},
                      timeout=120) as response:
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["seed"] == 2024 and "seed" not in chunks[-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == seeded["choices"][0]["text"]
