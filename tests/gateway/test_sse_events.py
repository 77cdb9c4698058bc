"""A streamed chunk's server-sent event: the cached plain delta is byte for byte what encoding the whole chunk gives."""
from __future__ import annotations

import json

import pytest

from gateway.openai.responses import ResponseWriter, sse

TEXTS = ["", "plain", 'a "quoted" \\ back', "line\nbreak\ttab\r", "\x00\x01\x1f control", "é ü 中文 🙂",
         "\u2028\u2029 separators", "data: [DONE]\n\n", "\x00specd text\x00"]


@pytest.mark.parametrize("chat", [True, False])
def test_every_event_equals_the_whole_chunk_encoded(chat):
    cached, encoded = ResponseWriter("the model", chat), ResponseWriter("the model", chat)
    encoded.id, encoded.created = cached.id, cached.created
    for index in (0, 1):
        steps = [(text, None, None) for text in TEXTS] + [("end", "length", None)]
        for number, (text, finish_reason, logprobs) in enumerate(steps):
            seed = 7 if number == 0 else None
            event = cached.event(text, finish_reason, logprobs, index, seed)
            assert event == sse(encoded.chunk(text, finish_reason, logprobs, index, seed))
            assert json.loads(event.decode()[len("data: "):])["choices"][0]["index"] == index


def test_the_first_chunk_still_names_the_role_and_carries_the_seed():
    writer = ResponseWriter("m", chat=True)
    first = json.loads(writer.event("Hi", None, None, 0, 42).decode()[len("data: "):])
    second = json.loads(writer.event("!", None, None, 0, None).decode()[len("data: "):])
    assert first["choices"][0]["delta"] == {"content": "Hi", "role": "assistant"} and first["seed"] == 42
    assert second["choices"][0]["delta"] == {"content": "!"} and "seed" not in second
