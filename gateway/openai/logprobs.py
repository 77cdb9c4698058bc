"""Logprobs in OpenAI's shapes: the legacy completions object and the chat `content` list.

Completions (`"logprobs": N`): {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}, where
each top_logprobs dict holds the N most likely tokens and, as OpenAI's legacy API does, the chosen token
when it is not among them. Chat (`"logprobs": true, "top_logprobs": N`): {content: [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]}, top_logprobs exactly the N most likely. A streamed chunk carries
the entries of the tokens whose text it sends (gateway/logprobs.py), with text_offset counted from the
start of the generated text.
"""
from __future__ import annotations

import math
from typing import Any

from gateway.request import SentLogprobs, TokenCandidate

# JSON has no -inf; a token the processed distribution cannot draw reads as vLLM writes it.
_NO_PROBABILITY = -9999.0


def completion_logprobs(entries: list[SentLogprobs]) -> dict[str, Any]:
    return {
        "tokens": [entry.chosen.text for entry in entries],
        "token_logprobs": [_number(entry.chosen.logprob) for entry in entries],
        "top_logprobs": [_top_dict(entry) for entry in entries],
        "text_offset": [entry.text_offset for entry in entries],
    }


def chat_logprobs(entries: list[SentLogprobs]) -> dict[str, Any]:
    content = [{**_chat_candidate(entry.chosen), "top_logprobs": [_chat_candidate(c) for c in entry.top]}
               for entry in entries]
    return {"content": content, "refusal": None}


def _top_dict(entry: SentLogprobs) -> dict[str, float]:
    candidates = entry.top
    if all(candidate.token_id != entry.chosen.token_id for candidate in candidates):
        candidates += (entry.chosen,)
    return {candidate.text: _number(candidate.logprob) for candidate in candidates}


def _chat_candidate(candidate: TokenCandidate) -> dict[str, Any]:
    return {"token": candidate.text, "logprob": _number(candidate.logprob), "bytes": list(candidate.utf8)}


def _number(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _NO_PROBABILITY
