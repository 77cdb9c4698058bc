"""OpenAI's `n` over the real HTTP API (gateway/choices.py): n generations of one prompt in one response."""
import asyncio
import json

import grpc
import httpx
import pytest

from support.gateway_stack import REPLY

pytestmark = pytest.mark.asyncio(loop_scope="session")


def sse_events(body: str) -> list:
    events = [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


async def test_n_choices_come_back_indexed_with_seeds_counted_up_and_usage_summed(client, stack):
    before = len(stack.verifier.requests)
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 40,
                                                          "n": 3, "seed": 7, "temperature": 1})
    body = response.json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (i, REPLY, "stop") for i in range(3)]
    sent = stack.verifier.requests[before:]
    assert sorted(r.sampling.seed for r in sent) == [7, 8, 9]  # choice i reproduces alone with seed + i
    assert len({tuple(r.prompt_token_ids) for r in sent}) == 1
    usage = body["usage"]
    assert usage["completion_tokens"] == 3 * len(stack.reply_ids)
    assert usage["prompt_tokens"] == len(sent[0].prompt_token_ids)  # the prompt counts once


async def test_unseeded_sampled_choices_share_one_reported_seed_that_reproduces_them_all(client, stack):
    """The gateway draws the seed (for n = 1 the verifier does), so that the response's one `seed` with the
    same n reproduces every choice; greedy choices need none."""
    before = len(stack.verifier.requests)
    body = (await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "n": 2,
                                                       "temperature": 1})).json()
    seeds = sorted(r.sampling.seed for r in stack.verifier.requests[before:])
    assert seeds == [body["seed"], body["seed"] + 1]
    before = len(stack.verifier.requests)
    body = (await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "n": 2,
                                                       "temperature": 0})).json()
    assert [r.sampling.HasField("seed") for r in stack.verifier.requests[before:]] == [False, False]
    assert body["seed"] is None


async def test_streamed_choices_report_the_seed_once_on_choice_0s_first_chunk(client):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "n": 3, "seed": 40,
                                                          "stream": True})
    chunks = sse_events(response.text)[:-1]
    with_seed = [c for c in chunks if "seed" in c]
    assert len(with_seed) == 1 and with_seed[0]["seed"] == 40 and with_seed[0]["choices"][0]["index"] == 0
    assert with_seed[0] is next(c for c in chunks if c["choices"][0]["index"] == 0)


async def test_streamed_chat_choices_each_start_with_the_role_and_finish_once(client, stack):
    response = await client.post("/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": "Hi"}], "n": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert not any("role" in c["delta"] for c in mine[1:])
        assert "".join(c["delta"].get("content", "") for c in mine) == REPLY
        assert [c["finish_reason"] for c in mine].count("stop") == 1 and mine[-1]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 2 * len(stack.reply_ids)


async def test_a_client_that_leaves_cancels_every_choice(stack):
    stack.verifier.hold_after_steps = 1
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        request = asyncio.create_task(client.post("/v1/completions", json={"model": "default", "prompt": "x",
                                                                           "n": 3}))
        while stack.verifier.live < 3:  # choice 0 first, the other two after its first chunk
            await asyncio.sleep(0.01)
        request.cancel()
    for _ in range(500):
        if stack.verifier.live == 0:
            break
        await asyncio.sleep(0.01)
    assert stack.verifier.live == 0


async def test_a_choice_that_fails_fails_the_request_with_its_status(client, stack):
    stack.verifier.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "x", "n": 2})
    assert response.status_code == 429
