"""Logprobs through the gateway (in front of the scripted verifier, which reports made-up values): OpenAI's shapes
on both endpoints, streamed with the text they belong to, the same over gRPC, and bad values refused.

The reply " Hello 世界 🎉 done." is 12 tokens and EOS; 世, 界 and 🎉 each span several tokens, whose text the
gateway holds back until the character is whole.
"""
import json

import grpc
import pytest
import pytest_asyncio

from specd.serving import open_channel
from specd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from support.gateway_stack import REPLY
from support.scripted_verifier import scripted_logprobs

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Where each reply token's text starts: a token that begins inside a character starts where that character does.
TEXT_OFFSETS = [0, 6, 7, 7, 8, 8, 8, 9, 10, 10, 11, 16, 17]  # " Hello", " ", 世 (2 tokens), 界 (3), " 🎉" (3), ...
USER = [{"role": "user", "content": "Hi"}]


def expected_values(stack, num_top: int) -> list[tuple[float, list[float]]]:
    """(logprob, top logprobs) the scripted verifier reports for each reply token."""
    entries = [scripted_logprobs(i, token, num_top) for i, token in enumerate(stack.reply_ids)]
    return [(entry.chosen.logprob, [top.logprob for top in entry.top]) for entry in entries]


def sse_choices(body: str) -> list[dict]:
    events = [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]
    return [json.loads(event)["choices"][0] for event in events[:-1] if json.loads(event)["choices"]]


async def completion(client, stream: bool, **fields) -> tuple[str, list[dict]]:
    """(text, [logprobs object of each choice]) of a completion, streamed or not."""
    body = {"model": "default", "prompt": "Hi", "max_tokens": 40, "stream": stream, **fields}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choices = sse_choices(response.text) if stream else [response.json()["choices"][0]]
    return "".join(c["text"] for c in choices), [c["logprobs"] for c in choices]


def merged(objects: list[dict]) -> dict:
    """Streamed completions logprobs objects, concatenated field by field."""
    return {key: [value for obj in objects for value in obj[key]] for key in objects[0]}


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_logprobs_have_openais_legacy_shape(client, stack, tokenizer, stream):
    text, objects = await completion(client, stream, logprobs=2)
    logprobs = merged(objects)
    assert text == REPLY
    assert logprobs["tokens"] == [tokenizer.backend.decode([t], skip_special_tokens=False) for t in stack.reply_ids]
    assert logprobs["text_offset"] == TEXT_OFFSETS
    values = expected_values(stack, num_top=2)
    assert logprobs["token_logprobs"] == [chosen for chosen, _ in values]
    for top, token, (_, top_values) in zip(logprobs["top_logprobs"], logprobs["tokens"], values):
        assert list(top.values()) == top_values and next(iter(top)) == token  # sorted; the token is the likeliest


async def test_completions_with_logprobs_0_list_the_chosen_token_alone(client):
    _, (logprobs,) = await completion(client, stream=False, logprobs=0)
    assert all(len(top) == 1 for top in logprobs["top_logprobs"])


async def test_each_streamed_chunk_carries_the_logprobs_of_the_text_it_sends(client):
    response = await client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 40,
                                                          "stream": True, "logprobs": 1})
    sent = 0
    for choice in sse_choices(response.text):
        offsets = choice["logprobs"]["text_offset"]
        # each token's text starts in this chunk (the final EOS has none: it starts at the end)
        assert all(sent <= offset < sent + len(choice["text"]) or offset == len(REPLY) for offset in offsets)
        sent += len(choice["text"])


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_logprobs_have_openais_shape_with_exact_bytes(client, stack, stream):
    body = {"model": "default", "messages": USER, "logprobs": True, "top_logprobs": 3, "stream": stream}
    response = await client.post("/v1/chat/completions", json=body)
    choices = sse_choices(response.text) if stream else [response.json()["choices"][0]]
    content = [entry for choice in choices for entry in choice["logprobs"]["content"]]
    assert [(entry["logprob"], [t["logprob"] for t in entry["top_logprobs"]]) for entry in content] == \
        expected_values(stack, num_top=3)
    assert all(len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["token"] == entry["token"]
               for entry in content)
    text_bytes = b"".join(bytes(entry["bytes"]) for entry in content[:-1])  # the last is EOS, not text
    assert text_bytes.decode() == REPLY
    assert content[2]["token"] == "\ufffd" and bytes(content[2]["bytes"]) == "世".encode()[:2]


@pytest.mark.parametrize("stop, sent", [("世界", 2), ("llo 世", 1), ("🎉", 8), ("done", 11)])
async def test_a_stop_string_drops_the_logprobs_of_the_tokens_it_cuts(client, stop, sent):
    """Tokens whose text starts before the stop string are sent (" Hello" when "llo" stops it, " 🎉"'s first token
    for its space, " done" for its space); the rest are not."""
    text, (logprobs,) = await completion(client, stream=False, logprobs=1, stop=stop)
    assert text == REPLY[:REPLY.index(stop)]
    assert logprobs["text_offset"] == TEXT_OFFSETS[:sent]


async def test_streamed_logprobs_stop_at_a_stop_string_too(client):
    _, objects = await completion(client, stream=True, logprobs=1, stop="🎉")
    assert merged(objects)["text_offset"] == TEXT_OFFSETS[:8]


async def test_requests_without_logprobs_get_null_and_ask_the_verifier_for_none(client, stack):
    _, (logprobs,) = await completion(client, stream=False)
    assert logprobs is None and not stack.verifier.requests[-1].sampling.HasField("logprobs")


async def test_the_verifier_is_asked_for_the_number_and_the_mode(client, stack):
    await client.post("/v1/chat/completions", json={"model": "default", "messages": USER, "logprobs": True,
                                                    "top_logprobs": 7, "logprobs_mode": "processed"})
    sampling = stack.verifier.requests[-1].sampling
    assert sampling.logprobs == 7 and sampling.logprobs_mode == common_pb2.TOKEN_LOGPROBS_MODE_PROCESSED
    await client.post("/v1/chat/completions", json={"model": "default", "messages": USER, "logprobs": True})
    sampling = stack.verifier.requests[-1].sampling
    assert sampling.HasField("logprobs") and sampling.logprobs == 0
    assert sampling.logprobs_mode == common_pb2.TOKEN_LOGPROBS_MODE_RAW


@pytest.mark.parametrize("chat, fields, param", [
    (False, {"logprobs": 21}, "logprobs"),
    (False, {"logprobs": -1}, "logprobs"),
    (False, {"logprobs": True}, "logprobs"),
    (False, {"logprobs": "2"}, "logprobs"),
    (False, {"logprobs": 2, "logprobs_mode": "sampled"}, "logprobs_mode"),
    (False, {"top_logprobs": 2}, "top_logprobs"),  # a chat parameter
    (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (True, {"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
    (True, {"logprobs": 2}, "logprobs"),
    (True, {"logprobs": True, "logprobs_mode": 1}, "logprobs_mode"),
])
async def test_bad_logprobs_fields_are_400s_naming_them(client, chat, fields, param):
    body = {"model": "default", **({"messages": USER} if chat else {"prompt": "Hi"}), **fields}
    response = await client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)


# -- gRPC -----------------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stub(stack):
    channel = open_channel(stack.grpc_address)
    yield gateway_pb2_grpc.GatewayStub(channel)
    await channel.close()


async def test_grpc_messages_carry_the_logprobs_of_their_text_with_token_text(stub, stack, tokenizer):
    request = gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=40, logprobs=2)
    messages = [m async for m in stub.Generate(request)]
    entries = [entry for m in messages for entry in m.logprobs]
    assert [entry.chosen.token_id for entry in entries] == stack.reply_ids
    assert [(e.chosen.logprob, [t.logprob for t in e.top]) for e in entries] == expected_values(stack, num_top=2)
    assert b"".join(entry.chosen.token_bytes for entry in entries[:-1]).decode() == REPLY
    assert entries[0].chosen.token == " Hello" and entries[0].top[0].token == " Hello"
    sent = 0
    for message in messages:  # a message's logprobs are those of the text it carries
        assert all(sent <= TEXT_OFFSETS[stack.reply_ids.index(e.chosen.token_id)] < sent + len(message.text)
                   for e in message.logprobs[:len(message.logprobs) - (message.finish_reason != "")])
        sent += len(message.text)


@pytest.mark.parametrize("fields, name", [(dict(logprobs=21), "logprobs"), (dict(logprobs=-2), "logprobs"),
                                          (dict(logprobs=1, logprobs_mode=7), "logprobs_mode")])
async def test_grpc_bad_logprobs_fields_are_invalid_argument_naming_them(stub, fields, name):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        [m async for m in stub.Generate(gateway_pb2.GenerateRequest(prompt="Hi", **fields))]
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details().startswith(name)
