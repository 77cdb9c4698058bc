"""OpenAI response bodies: completion and chat objects, their stream chunks, usage and errors."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

import grpc

from gateway.openai.choices import Choice
from gateway.openai.logprobs import chat_logprobs, completion_logprobs
from gateway.request import SentLogprobs, Usage

# How a grpc status reads over HTTP.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
}


def error_body(message: str, error_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": None}}


def status_for(code: grpc.StatusCode) -> tuple[int, str]:
    """HTTP status and OpenAI error type for a grpc status."""
    return HTTP_STATUS.get(code, (500, "server_error"))


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "speculative": {"draft_tokens": usage.draft_tokens, "accepted_tokens": usage.accepted_tokens,
                        "steps": usage.steps, "num_speculative_tokens": usage.num_speculative_tokens},
    }


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


_json_string = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) writes a str as, in one C call
_TEXT_MARK = "\x00specd text\x00"  # stands for the text in a cached event (ids and names cannot hold a NUL)


def _split_around_text(body: dict[str, Any]) -> tuple[bytes, bytes]:
    before, after = sse(body).split(json.dumps(_TEXT_MARK).encode())
    return before, after


class ResponseWriter:
    """Builds one request's response objects; `chat` picks chat.completion over text_completion.

    Extension field `seed`: the seed the request sampled with (the client's, or the random one drawn for it;
    choice i of n used seed + i), on the full response and the first streamed chunk of choice 0; null for a
    greedy request without one. Sending it back as `seed` reproduces the response.
    """

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self._sent_role: set[int] = set()  # choices whose first chat delta (with the role) went out
        self._sent_seed = False  # whether choice 0's first chunk (with the seed) went out
        self._text_events: dict[int, tuple[bytes, bytes]] = {}  # choice index -> a plain delta's event around its text

    def _envelope(self, object_name: str, choices: list, usage: Usage | None) -> dict[str, Any]:
        body = {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
                "choices": choices}
        body["usage"] = usage_body(usage) if usage is not None else None
        return body

    def full(self, choices: list[Choice], usage: Usage, seed: int | None = None) -> dict[str, Any]:
        """The non-streaming response; a choice's logprobs are None where the request did not ask."""
        if self.chat:
            bodies = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                       "finish_reason": c.finish_reason, "logprobs": self._logprobs(c.logprobs)} for c in choices]
            return self._envelope("chat.completion", bodies, usage) | {"seed": seed}
        bodies = [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                   "logprobs": self._logprobs(c.logprobs)} for c in choices]
        return self._envelope("text_completion", bodies, usage) | {"seed": seed}

    def chunk(self, text: str, finish_reason: str | None, logprobs: list[SentLogprobs] | None = None,
              index: int = 0, seed: int | None = None) -> dict[str, Any]:
        """One streamed delta of choice `index` (usage travels in its own final chunk, see usage_chunk); choice
        0's first one carries the seed."""
        if self.chat:
            delta = {"content": text}
            if index not in self._sent_role:  # each choice's first delta names the role
                delta["role"] = "assistant"
                self._sent_role.add(index)
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason,
                      "logprobs": self._logprobs(logprobs)}
            return self._with_seed(self._envelope("chat.completion.chunk", [choice], None), index, seed)
        choice = {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": self._logprobs(logprobs)}
        return self._with_seed(self._envelope("text_completion", [choice], None), index, seed)

    def event(self, text: str, finish_reason: str | None, logprobs: list[SentLogprobs] | None = None,
              index: int = 0, seed: int | None = None) -> bytes:
        """`chunk(...)` as one server-sent event. Most of a stream's events are a plain delta (text only: no role,
        seed, finish reason or logprobs); those are the choice's cached event with just the text encoded into it,
        the same bytes for a fraction of the work, on a path taken once per step of every streamed request."""
        plain = finish_reason is None and logprobs is None and self._sent_seed
        if not plain or self.chat and index not in self._sent_role:
            return sse(self.chunk(text, finish_reason, logprobs, index, seed))
        around = self._text_events.get(index)
        if around is None:
            around = self._text_events[index] = _split_around_text(self.chunk(_TEXT_MARK, None, None, index))
        return around[0] + _json_string(text).encode() + around[1]

    def _with_seed(self, body: dict[str, Any], index: int, seed: int | None) -> dict[str, Any]:
        if index == 0 and not self._sent_seed:
            body["seed"], self._sent_seed = seed, True
        return body

    def _logprobs(self, entries: list[SentLogprobs] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last chunk when stream_options.include_usage: no choices, the request's usage."""
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage)
