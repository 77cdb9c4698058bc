"""The OpenAI-compatible HTTP API over a real uvicorn server, with httpx as the client."""
import asyncio
import json

import grpc
import httpx
import pytest

from support.gateway_stack import REPLY, start_gateway_stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


def sse_events(body: str) -> list:
    """The data payloads of an SSE body, JSON-decoded except the final [DONE]."""
    events = [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


async def test_completion_returns_the_text_and_usage_with_speculative_counts(client, stack, tokenizer):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 40})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == REPLY and body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(tokenizer.encode("Hi"))
    assert usage["completion_tokens"] == len(stack.reply_ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert set(usage["speculative"]) == {"draft_tokens", "accepted_tokens", "steps", "num_speculative_tokens"}
    assert usage["speculative"]["accepted_tokens"] <= usage["speculative"]["draft_tokens"]
    assert usage["speculative"]["num_speculative_tokens"] == 4  # the verifier's default k


async def test_usage_says_how_many_drafts_per_step_a_request_got(client):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 40,
                                                          "num_speculative_tokens": 50})
    assert response.json()["usage"]["speculative"]["num_speculative_tokens"] == 8  # clamped by the verifier


async def test_streaming_completion_sends_deltas_then_usage_then_done(client, stack):
    response = await client.post("/v1/completions", json={
        "model": "SmolLM2-135M-Instruct", "prompt": "Hi", "stream": True,
        "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == len(stack.reply_ids)


async def test_streaming_without_include_usage_sends_no_usage_chunk(client):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "stream": True})
    events = sse_events(response.text)
    assert events[-1] == "[DONE]" and all(e["choices"] for e in events[:-1])


async def test_chat_completion_renders_the_template_and_answers_as_assistant(client, stack, tokenizer):
    messages = [{"role": "user", "content": "Hello!"}]
    response = await client.post("/v1/chat/completions", json={"model": "default", "messages": messages})
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    prompt = tokenizer.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert list(stack.verifier.requests[-1].prompt_token_ids) == tokenizer.hf.encode(prompt, add_special_tokens=False)


async def test_streaming_chat_sends_the_role_first_then_content(client):
    response = await client.post("/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
    chunks = sse_events(response.text)[:-1]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == REPLY


async def test_num_speculative_tokens_and_sampling_fields_reach_the_verifier(client, stack):
    await client.post("/v1/completions", json={
        "model": "default", "prompt": [7, 8], "max_tokens": 3, "temperature": 0, "top_p": 0.9,
        "stop": "never", "seed": 4, "num_speculative_tokens": 0})
    sent = stack.verifier.requests[-1]
    assert list(sent.prompt_token_ids) == [7, 8] and sent.sampling.max_tokens == 3
    assert sent.sampling.temperature == 0 and sent.sampling.num_speculative_tokens == 0


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
], ids=["completion", "chat"])
async def test_responses_report_the_seed_the_request_sampled_with(client, stack, path, body):
    """Extension field `seed`: the verifier's random one for a sampled request without one (sending it back
    reproduces the text), the client's own when given, null for greedy; in a stream, on the first chunk."""
    body = {"model": "default", **body}
    assert (await client.post(path, json=body)).json()["seed"] == stack.verifier.drawn_seed
    assert (await client.post(path, json=body | {"seed": 11})).json()["seed"] == 11
    assert (await client.post(path, json=body | {"temperature": 0})).json()["seed"] is None
    chunks = sse_events((await client.post(path, json=body | {"seed": 12, "stream": True})).text)[:-1]
    assert chunks[0]["seed"] == 12 and len(chunks) > 1 and all("seed" not in c for c in chunks[1:])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_penalties_and_logit_bias_reach_the_verifier(client, stack, path):
    prompt = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    response = await client.post(path, json={
        "model": "default", **prompt, "max_tokens": 3, "presence_penalty": 0.5, "frequency_penalty": -1,
        "repetition_penalty": 1.25, "logit_bias": {"50": 100, "7": -100}})
    assert response.status_code == 200, response.text
    sampling = stack.verifier.requests[-1].sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (0.5, -1.0, 1.25)
    assert dict(sampling.logit_bias) == {50: 100.0, 7: -100.0}


BAD_BODIES = [
    ({"model": "gpt-4", "prompt": "x"}, "model"),
    ({"model": "default", "prompt": "x", "temperature": -1}, "temperature"),
    ({"model": "default", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "default", "prompt": "x", "top_p": 0}, "top_p"),
    ({"model": "default", "prompt": "x", "min_p": 2}, "min_p"),
    ({"model": "default", "prompt": "x", "top_k": -3}, "top_k"),
    ({"model": "default", "prompt": ""}, "prompt"),
    ({"model": "default", "prompt": [1, 10**6]}, "prompt"),  # the HTTP field, not the gRPC one
    ({"model": "default", "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": "default"}, "prompt"),
    ({"model": "default", "prompt": "x", "n": 0}, "n"),
    ({"model": "default", "prompt": "x", "n": 129}, "n"),
    ({"model": "default", "prompt": "x", "num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"model": "default", "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "default", "prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
    ({"model": "default", "prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": "default", "prompt": "x", "logit_bias": {"50256000": 5}}, 'logit_bias["50256000"]'),
    ({"model": "default", "prompt": "x", "logit_bias": {"5": 101}}, 'logit_bias["5"]'),
    ({"model": "default", "prompt": "x", "logit_bias": {"5": "up"}}, 'logit_bias["5"]'),
    ({"model": "default", "prompt": "x", "logit_bias": {"the": 5}}, "logit_bias"),
    ({"model": "default", "prompt": "x", "logit_bias": [5]}, "logit_bias"),
]


@pytest.mark.parametrize("body,param", BAD_BODIES)
async def test_bad_fields_get_an_openai_style_400_naming_them(client, body, param):
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]


async def test_malformed_json_and_wrong_content_type_are_400(client, stack):
    errors = stack.gateway.pipeline.metrics.registry.get_sample_value(
        "specd_request_errors_total", {"code": "INVALID_ARGUMENT"}) or 0
    response = await client.post("/v1/completions", content=b"{not json",
                                 headers={"content-type": "application/json"})
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]["message"]
    response = await client.post("/v1/completions", content=b"prompt=x",
                                 headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "content-type"
    assert stack.gateway.pipeline.metrics.registry.get_sample_value(
        "specd_request_errors_total", {"code": "INVALID_ARGUMENT"}) == errors + 2


async def test_a_full_verifier_is_429(client, stack):
    stack.verifier.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    for stream in (False, True):
        response = await client.post("/v1/completions", json={"model": "default", "prompt": "x", "stream": stream})
        assert response.status_code == 429


async def test_models_lists_the_served_model(client):
    data = (await client.get("/v1/models")).json()["data"]
    assert [m["id"] for m in data] == ["SmolLM2-135M-Instruct"]


async def test_metrics_expose_the_gateway_metrics(client):
    await client.post("/v1/completions", json={"model": "default", "prompt": "Hi"})
    text = (await client.get("/metrics")).text
    for name in ("specd_time_to_first_token_seconds_bucket", "specd_inter_token_latency_seconds_bucket",
                 "specd_e2e_request_latency_seconds_bucket", "specd_request_queue_time_seconds_bucket",
                 "specd_prompt_tokens_total", "specd_generation_tokens_total",
                 'specd_requests_total{finish_reason="stop"}', 'specd_request_errors_total{code="INVALID_ARGUMENT"}'):
        assert name in text


async def test_a_disconnecting_streaming_client_cancels_the_verifier_call_and_counts_an_abort(client, stack):
    registry = stack.gateway.pipeline.metrics.registry
    aborted = registry.get_sample_value("specd_requests_total", {"finish_reason": "abort"}) or 0
    stack.verifier.hold_after_steps = 1
    async with client.stream("POST", "/v1/completions",
                             json={"model": "default", "prompt": "x", "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                break  # one delta arrived; now hang up
    await asyncio.wait_for(stack.verifier.cancelled.wait(), 5)
    assert registry.get_sample_value("specd_requests_total", {"finish_reason": "abort"}) == aborted + 1


async def test_a_disconnecting_non_streaming_client_cancels_the_verifier_call(stack):
    stack.verifier.hold_after_steps = 1
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        request = asyncio.create_task(client.post("/v1/completions", json={"model": "default", "prompt": "x"}))
        while not stack.verifier.live:
            await asyncio.sleep(0.01)
        request.cancel()
    await asyncio.wait_for(stack.verifier.cancelled.wait(), 5)


async def test_health_follows_the_verifiers(tokenizer):
    stack = await start_gateway_stack(tokenizer)
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        assert (await client.get("/health")).status_code == 200
        await stack.verifier.stop()
        await stack.gateway.pipeline.router.poll()
        assert (await client.get("/health")).status_code == 503
    await stack.gateway.stop(0)


async def test_with_an_api_key_v1_needs_the_bearer_token_but_probes_do_not(tokenizer):
    stack = await start_gateway_stack(tokenizer, api_key="s3cret")
    try:
        async with httpx.AsyncClient(base_url=stack.http_url) as client:
            body = {"model": "default", "prompt": "x"}
            assert (await client.post("/v1/completions", json=body)).status_code == 401
            wrong = {"authorization": "Bearer nope"}
            assert (await client.post("/v1/completions", json=body, headers=wrong)).status_code == 401
            right = {"authorization": "Bearer s3cret"}
            assert (await client.post("/v1/completions", json=body, headers=right)).status_code == 200
            assert (await client.get("/health")).status_code == 200
            metrics = await client.get("/metrics")
            assert 'specd_request_errors_total{code="UNAUTHENTICATED"} 2.0' in metrics.text
    finally:
        await stack.stop()


async def test_the_openai_client_streams_chat_with_usage(stack):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert chunks[-1].usage.completion_tokens == len(stack.reply_ids)
    assert chunks[-1].usage.model_extra["speculative"]["steps"] >= 1
    await client.close()


async def test_a_stream_interval_sends_the_same_text_in_fewer_events(tokenizer):
    """--stream-interval 4, one token a 5 ms verifier step: the first token's event at once, then one per 4 tokens."""
    events = {}
    for interval in (1, 4):
        stack = await start_gateway_stack(tokenizer, tokens_per_step=1, stream_interval=interval, step_seconds=0.005)
        try:
            async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as client:
                response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi",
                                                                      "stream": True})
            events[interval] = sse_events(response.text)[:-1]
        finally:
            await stack.stop()
    for chunks in events.values():
        assert "".join(c["choices"][0]["text"] for c in chunks) == REPLY
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    tokens = len(stack.reply_ids)  # 13: one event each at interval 1 (steps that pile up would merge)
    assert len(events[4]) <= 2 + (tokens - 1) // 4 < len(events[1])
