"""Request validation shared by gRPC and HTTP: typed fields in, a GenerationRequest or a RequestError out.

Each error names the field, so gRPC answers INVALID_ARGUMENT "field: why" and HTTP answers 400 with
{"error": {"message", "type", "param": field}}.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from gateway.request import GenerationRequest
from gateway.tokenizer import Tokenizer
from specd.float32 import as_float32
from specd.sampling import (CLIENT_FIELDS, LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS_ENTRIES, InvalidParameter,
                            SamplingParams, in_range)


class RequestError(ValueError):
    """A bad request field; `field` names it (the OpenAI `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = f"{field}: {message}"


@dataclass
class RequestFields:
    """What a client sent, already parsed into Python types; None = not given. The sampling fields are those of
    specd/sampling.py's CLIENT_FIELDS, by the schema's names (`of` sorts them out of keyword arguments)."""

    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict] | None = None  # chat completions: rendered with the chat template
    stop: list[str] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # logit_bias keys: strings from JSON, ints from gRPC
    default_max_tokens: int | None = None  # max_tokens when not given; None = the room left in the context
    # What the client called a field where its name differs from ours (HTTP sends token ids as `prompt`,
    # and `max_completion_tokens` for max_tokens): errors name the field the client sent.
    client_names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, **given: Any) -> RequestFields:
        """The fields from keyword arguments, the client's sampling fields among them."""
        sampling = {name: given.pop(name) for name in CLIENT_FIELDS if name in given}
        return cls(sampling=sampling, **given)

    def name(self, field_name: str) -> str:
        return self.client_names.get(field_name, field_name)


def validate(fields: RequestFields, tokenizer: Tokenizer, max_model_len: int) -> GenerationRequest:
    """The validated, tokenized request; raises RequestError naming the first bad field.

    Tokenizing may take a while (up to a context's worth of text): callers on an event loop run this
    on a worker thread, unless `text_chars` is small."""
    _check_text_size(fields, tokenizer, max_model_len)
    stop = tuple(fields.stop or ())
    _require(all(isinstance(s, str) and s for s in stop), "stop", "must be non-empty strings")
    for text in stop:
        _check_unicode(text, "stop")
    prompt_ids = _prompt_token_ids(fields, tokenizer)
    _check_prompt_length(prompt_ids, max_model_len, _prompt_field(fields))
    return GenerationRequest(prompt_token_ids=tuple(prompt_ids), stop=stop,
                             sampling=_sampling(fields, tokenizer, len(prompt_ids), max_model_len))


# Where the client's API differs from the schema's defaults: OpenAI samples at temperature 1 unless told otherwise.
CLIENT_DEFAULTS = {"temperature": 1.0}
_FLOAT_FIELDS = tuple(name for name, kind in get_type_hints(SamplingParams).items() if kind is float)


def _sampling(fields: RequestFields, tokenizer: Tokenizer, prompt_len: int, max_model_len: int) -> SamplingParams:
    """The schema's parameters from the client's sampling fields, defaults filled; the schema's own checks
    (specd/sampling.py) hold the bounds, and an error names the field as the client sent it, with its value.
    Only what the client's form adds is checked here: floats as the 32-bit floats they are sampled with, the
    context's room for max_tokens, top_k -1 (vLLM's "off"), the seed's int64 wire, logit_bias's JSON keys."""
    given = {name: value for name, value in fields.sampling.items() if value is not None}
    values = {**CLIENT_DEFAULTS, **given}
    for name in _FLOAT_FIELDS:
        if name in values:
            values[name] = _float32(values[name], fields.name(name))
    if values.get("top_k") == -1:
        values["top_k"] = 0
    seed = values.get("seed")
    _require(seed is None or 0 <= seed < 2**63, "seed", f"must be in [0, 2**63), got {seed}")
    values["max_tokens"] = _max_tokens(given.get("max_tokens"), fields, prompt_len, max_model_len)
    values["logit_bias"] = _logit_bias(given.get("logit_bias"), tokenizer.vocab_size)
    try:
        return SamplingParams(stop_token_ids=tokenizer.eos_token_ids, **values)
    except InvalidParameter as error:
        shown = repr(given[error.field])[:40] if error.field in given else "unset"
        raise RequestError(fields.name(error.field), f"{error.message}, got {shown}") from None


def validate_model_name(model: str | None, served_names: tuple[str, ...]) -> None:
    """The HTTP `model` field must name the served model (`served_names[0]` is the name it goes by)."""
    if model is None:
        raise RequestError("model", "is required")
    _require(model in served_names, "model",
             f"unknown model {model!r}; this server serves {served_names[0]!r} (also called 'default')")


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
        _require(not bad, fields.name("prompt_token_ids"),
                 f"token ids {bad[:5]} are outside the vocabulary [0, {tokenizer.vocab_size})")
        return ids
    _require(bool(fields.prompt), "prompt", "must not be empty (give prompt or prompt_token_ids)")
    return tokenizer.encode(fields.prompt)


def _prompt_field(fields: RequestFields) -> str:
    if fields.messages is not None:
        return "messages"
    return fields.name("prompt_token_ids") if fields.prompt_token_ids else "prompt"


def text_chars(fields: RequestFields) -> int:
    """How many characters of text the request brings to tokenize (its prompt, its messages' strings)."""
    return sum(len(text) for text, _ in _texts(fields))


def _texts(fields: RequestFields) -> list[tuple[str, str]]:
    """The request's text, each with the field it came in."""
    texts = [(fields.prompt, "prompt")] if fields.prompt is not None else []
    for index, message in enumerate(fields.messages or ()):
        texts += [(value, f"messages[{index}].{key}") for key, value in message.items() if isinstance(value, str)]
    return texts


def _check_text_size(fields: RequestFields, tokenizer: Tokenizer, max_model_len: int) -> None:
    """Text that cannot fit the context whatever its tokens is refused before it is tokenized: no token
    covers more than `max_token_chars` characters or `max_token_bytes` UTF-8 bytes."""
    texts = _texts(fields)
    size = _size(texts)
    limit = (tokenizer.max_token_chars * max_model_len, tokenizer.max_token_bytes * max_model_len)
    _require(size[0] <= limit[0] and size[1] <= limit[1], _prompt_field(fields),
             f"is {size[0]} characters ({size[1]} UTF-8 bytes), more than the model's context of "
             f"{max_model_len} tokens can hold")


def _size(texts: list[tuple[str, str]]) -> tuple[int, int]:
    """Characters and UTF-8 bytes of all `texts`; RequestError naming the field of one that is not valid Unicode."""
    chars = sum(len(text) for text, _ in texts)
    return chars, sum(len(_check_unicode(text, name)) for text, name in texts)


def _check_unicode(text: str, field_name: str) -> bytes:
    """`text` as UTF-8; JSON can carry lone surrogates (\\ud800), which are no text and no tokenizer takes."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(field_name, f"holds a lone surrogate (U+{ord(text[error.start]):04X}) at character "
                                       f"{error.start}; text must be valid Unicode") from None


def _check_prompt_length(prompt_ids: list[int], max_model_len: int, field_name: str) -> None:
    _require(len(prompt_ids) < max_model_len, field_name,
             f"is {len(prompt_ids)} tokens; the model's context is {max_model_len} tokens "
             "and at least one must be left to generate")


def _max_tokens(value: int | None, fields: RequestFields, prompt_len: int, max_model_len: int) -> int:
    room = max_model_len - prompt_len
    field_name = fields.name("max_tokens")
    if value is None:
        return room if fields.default_max_tokens is None else min(fields.default_max_tokens, room)
    _require(value >= 1, field_name, f"must be >= 1, got {value}")
    _require(value <= room, field_name,
             f"{value} + the prompt's {prompt_len} tokens exceeds the model's context of "
             f"{max_model_len} tokens (at most {room})")
    return value


def _float32(value: float, field_name: str) -> float:
    """`value` as the float32 the verifier samples with: a finite number that survives the rounding."""
    rounded = as_float32(value)
    _require(math.isfinite(rounded), field_name, f"must be a finite 32-bit float, got {value}")
    return rounded


def _logit_bias(value: dict | None, vocab_size: int) -> dict[int, float]:
    """(token id, bias) pairs; an error names the entry as the client wrote it: logit_bias["50256"] over
    HTTP (JSON keys are strings), logit_bias[50256] over gRPC."""
    if not value:
        return {}
    _require(len(value) <= MAX_LOGIT_BIAS_ENTRIES, "logit_bias",
             f"has {len(value)} entries, more than the {MAX_LOGIT_BIAS_ENTRIES} allowed")
    entries = {}
    for key, bias in value.items():
        token = _token_id(key)
        _require(token is not None, "logit_bias", f"keys must be token ids, got {json.dumps(key)[:40]}")
        name = f"logit_bias[{json.dumps(key)}]"
        _require(0 <= token < vocab_size, name, f"token id outside the vocabulary [0, {vocab_size})")
        _require(token not in entries, name, "names a token id given by another key too")
        rounded = _float32(bias, name)
        _require(in_range(rounded, LOGIT_BIAS_RANGE), name, f"must be in [-100, 100], got {bias}")
        entries[token] = rounded
    return dict(sorted(entries.items()))


def _token_id(key: str | int) -> int | None:
    """A JSON key's token id ("50256": ASCII digits, not "+5" or " 5"), or a gRPC key as it is."""
    if isinstance(key, int):
        return key
    return int(key) if key.isascii() and key.isdigit() and len(key) <= 10 else None
