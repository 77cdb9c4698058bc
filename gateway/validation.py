"""Request validation shared by gRPC and HTTP: typed fields in, a GenerationRequest or a RequestError out.

Each error names the field, so gRPC answers INVALID_ARGUMENT "field: why" and HTTP answers 400 with
{"error": {"message", "type", "param": field}}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.request import GenerationRequest
from gateway.tokenizer import Tokenizer


class RequestError(ValueError):
    """A bad request field; `field` names it (the OpenAI `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = f"{field}: {message}"


@dataclass
class RequestFields:
    """What a client sent, already parsed into Python types; None = not given."""

    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict] | None = None  # chat completions: rendered with the chat template
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    num_speculative_tokens: int | None = None


INT32_MAX = 2**31 - 1  # the wire type of top_k and num_speculative_tokens


def validate(fields: RequestFields, tokenizer: Tokenizer, max_model_len: int) -> GenerationRequest:
    """The validated, tokenized request; raises RequestError naming the first bad field."""
    _check_text_length(fields, tokenizer.max_token_chars * max_model_len)
    prompt_ids = _prompt_token_ids(fields, tokenizer)
    _check_prompt_length(prompt_ids, max_model_len)
    stop = tuple(fields.stop or ())
    _require(all(isinstance(s, str) and s for s in stop), "stop", "must be non-empty strings")
    return GenerationRequest(
        prompt_token_ids=tuple(prompt_ids),
        max_tokens=_max_tokens(fields.max_tokens, len(prompt_ids), max_model_len),
        temperature=_temperature(fields.temperature),
        top_p=_top_p(fields.top_p),
        top_k=_top_k(fields.top_k),
        min_p=_min_p(fields.min_p),
        seed=_seed(fields.seed),
        stop=stop,
        ignore_eos=bool(fields.ignore_eos),
        stop_token_ids=tokenizer.eos_token_ids,
        num_speculative_tokens=_num_speculative_tokens(fields.num_speculative_tokens),
    )


def validate_model_name(model: str | None, served_names: tuple[str, ...]) -> None:
    """The HTTP `model` field must name the served model (its name, folder name, or "default")."""
    if model is None:
        raise RequestError("model", "is required")
    _require(model in served_names, "model",
             f"unknown model {model!r}; this server serves {', '.join(map(repr, served_names))}")


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise RequestError(field, message)


def _prompt_token_ids(fields: RequestFields, tokenizer: Tokenizer) -> list[int]:
    if fields.messages is not None:
        _require(len(fields.messages) > 0, "messages", "must not be empty")
        try:
            return tokenizer.encode_chat(fields.messages)
        except Exception as error:  # template errors come as jinja / ValueError of many kinds
            raise RequestError("messages", f"cannot be rendered by the chat template: {error}") from error
    given = [name for name in ("prompt", "prompt_token_ids") if getattr(fields, name)]
    _require(len(given) <= 1, "prompt", "give exactly one of prompt and prompt_token_ids, not both")
    if fields.prompt_token_ids:
        ids = list(fields.prompt_token_ids)
        bad = [i for i in ids if not 0 <= i < tokenizer.vocab_size]
        _require(not bad, "prompt_token_ids",
                 f"ids {bad[:5]} are outside the vocabulary [0, {tokenizer.vocab_size})")
        return ids
    _require(bool(fields.prompt), "prompt", "must not be empty (give prompt or prompt_token_ids)")
    return tokenizer.encode(fields.prompt)


def _check_text_length(fields: RequestFields, max_chars: int) -> None:
    """Text that cannot fit the context whatever its tokens is refused before it is tokenized."""
    if fields.prompt is not None:
        _require(len(fields.prompt) <= max_chars, "prompt",
                 f"is {len(fields.prompt)} characters, more than the model's context can hold")
    if fields.messages is not None:
        size = sum(len(str(message)) for message in fields.messages)
        _require(size <= max_chars, "messages",
                 f"hold {size} characters, more than the model's context can hold")


def _check_prompt_length(prompt_ids: list[int], max_model_len: int) -> None:
    _require(len(prompt_ids) < max_model_len, "prompt",
             f"is {len(prompt_ids)} tokens; the model's context is {max_model_len} tokens "
             "and at least one must be left to generate")


def _max_tokens(value: int | None, prompt_len: int, max_model_len: int) -> int:
    room = max_model_len - prompt_len
    if value is None:
        return room
    _require(value >= 1, "max_tokens", f"must be >= 1, got {value}")
    _require(value <= room, "max_tokens",
             f"{value} + the prompt's {prompt_len} tokens exceeds the model's context of "
             f"{max_model_len} tokens (at most {room})")
    return value


def _finite(value: float, field: str) -> float:
    _require(math.isfinite(value), field, f"must be a finite number, got {value}")
    return value


def _temperature(value: float | None) -> float:
    if value is None:
        return 1.0
    _require(_finite(value, "temperature") >= 0.0, "temperature", f"must be >= 0, got {value}")
    return float(value)


def _top_p(value: float | None) -> float:
    if value is None:
        return 1.0
    _require(0.0 < _finite(value, "top_p") <= 1.0, "top_p", f"must be in (0, 1], got {value}")
    return float(value)


def _top_k(value: int | None) -> int:
    if value is None or value == -1:  # -1 is vLLM's "off"
        return 0
    _require(0 <= value <= INT32_MAX, "top_k", f"must be in [1, {INT32_MAX}], or 0 / -1 for off, got {value}")
    return value


def _min_p(value: float | None) -> float:
    if value is None:
        return 0.0
    _require(0.0 <= _finite(value, "min_p") <= 1.0, "min_p", f"must be in [0, 1], got {value}")
    return float(value)


def _seed(value: int | None) -> int | None:
    _require(value is None or 0 <= value < 2**63, "seed", f"must be in [0, 2**63), got {value}")
    return value


def _num_speculative_tokens(value: int | None) -> int | None:
    _require(value is None or 0 <= value <= INT32_MAX, "num_speculative_tokens",
             f"must be in [0, {INT32_MAX}] (0 turns speculation off), got {value}")
    return value
