"""n and best_of on both HTTP endpoints (gateway/openai/choices.py), in front of the scripted verifier: every sample
is its REPLY; its logprobs are lower by (seed % 4) / 4 per token, which is what best_of ranks by here."""
import asyncio
import json

import grpc
import httpx
import pytest

from support.gateway_stack import REPLY

pytestmark = pytest.mark.asyncio(loop_scope="session")

USER = [{"role": "user", "content": "Hi"}]


def sse_events(body: str) -> list[dict]:
    events = [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_n_returns_n_indexed_choices_with_seeds_seed_plus_i_and_summed_usage(client, stack, chat):
    body = {"model": "default", "max_tokens": 40, "n": 3, "seed": 7, "temperature": 1,
            **({"messages": USER} if chat else {"prompt": "Hi"})}
    before = len(stack.verifier.requests)
    response = await client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    choices = response.json()["choices"]
    assert [(c["index"], c["finish_reason"]) for c in choices] == [(i, "stop") for i in range(3)]
    assert all((c["message"]["content"] if chat else c["text"]) == REPLY for c in choices)
    sent = stack.verifier.requests[before:]
    assert sorted(r.sampling.seed for r in sent) == [7, 8, 9]  # choice i reproduces alone with seed + i
    assert len({tuple(r.prompt_token_ids) for r in sent}) == 1
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == len(sent[0].prompt_token_ids)  # the prompt once
    assert usage["completion_tokens"] == 3 * len(stack.reply_ids)


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


async def test_best_of_reports_the_seed_of_sample_0_whichever_samples_are_returned(client, stack):
    """With the same n and best_of, sample 0's seed reproduces every sample, hence the same choices."""
    before = len(stack.verifier.requests)
    body = (await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "n": 1, "best_of": 3,
                                                       "temperature": 1})).json()
    seeds = sorted(r.sampling.seed for r in stack.verifier.requests[before:])
    assert seeds == [body["seed"], body["seed"] + 1, body["seed"] + 2]


async def test_streamed_choices_report_the_seed_once_on_choice_0s_first_chunk(client):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "n": 3, "seed": 40,
                                                          "stream": True})
    chunks = sse_events(response.text)
    with_seed = [c for c in chunks if "seed" in c]
    assert len(with_seed) == 1 and with_seed[0]["seed"] == 40 and with_seed[0]["choices"][0]["index"] == 0
    assert with_seed[0] is next(c for c in chunks if c["choices"][0]["index"] == 0)


async def test_streamed_choices_name_their_index_each_with_its_role_and_finish(client, stack):
    body = {"model": "default", "messages": USER, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events((await client.post("/v1/chat/completions", json=body)).text)
    *chunks, usage_chunk = events
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["delta"]["content"] for c in mine) == REPLY
        assert [c["delta"].get("role") for c in mine][:1] == ["assistant"]
        assert all("role" not in c["delta"] for c in mine[1:])
        assert [c["finish_reason"] for c in mine][-1] == "stop" and all(not c["finish_reason"] for c in mine[:-1])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 2 * len(stack.reply_ids)


async def test_the_other_samples_wait_for_the_first_ones_first_token(stack):
    """Until the first sample has a token, its prompt is not in the prefix cache: nothing else is sent."""
    stack.verifier.hold_after_steps = 0  # every call holds before its first token
    before = len(stack.verifier.requests)
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "n": 3}, timeout=1.0)
    assert len(stack.verifier.requests) == before + 1
    await asyncio.wait_for(stack.verifier.cancelled.wait(), 5)  # the client left: its sample is cancelled


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


async def test_best_of_returns_the_n_samples_with_the_highest_cumulative_logprob(client, stack):
    body = {"model": "default", "prompt": "Hi", "n": 2, "best_of": 3, "seed": 10, "logprobs": 1}
    before = len(stack.verifier.requests)
    response = (await client.post("/v1/completions", json=body)).json()
    offsets = [choice["logprobs"]["token_logprobs"][0] + 1 / 8 for choice in response["choices"]]
    assert offsets == [0.0, -0.5]  # seed 12 (12 % 4 = 0), then seed 10; seed 11 (-0.75) is left out
    assert [c["index"] for c in response["choices"]] == [0, 1]
    assert response["usage"]["completion_tokens"] == 3 * len(stack.reply_ids)  # every sample counts
    assert len(stack.verifier.requests) == before + 3
    assert response["seed"] == 10


async def test_best_of_ranks_by_logprobs_the_client_did_not_ask_for_and_returns_none(client, stack):
    body = {"model": "default", "prompt": "Hi", "best_of": 2}
    response = (await client.post("/v1/completions", json=body)).json()
    assert [c["logprobs"] for c in response["choices"]] == [None]
    assert all(r.sampling.HasField("logprobs") for r in stack.verifier.requests[-2:])


@pytest.mark.parametrize("fields, param", [
    ({"n": 0}, "n"), ({"n": 129}, "n"), ({"n": "2"}, "n"), ({"n": 3, "best_of": 2}, "best_of"),
    ({"best_of": 129}, "best_of"), ({"best_of": 2, "stream": True}, "best_of"),
])
async def test_bad_n_and_best_of_are_400s_naming_them(client, fields, param):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", **fields})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
