"""The OpenAI request bodies the HTTP API accepts (types only; ranges are checked in validation.py).

Types are strict, as OpenAI's are: "4" is no integer and "yes" no boolean. A field the body does not
know is refused naming it (gateway/openai/unsupported.py says which OpenAI parameters are not built).
"""
from __future__ import annotations

import json
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from gateway.openai.choices import MAX_CHOICES
from gateway.validation import RequestError, RequestFields
from specd.sampling import CLIENT_FIELDS, SamplingParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat fills the context


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


# The schema's client fields (specd/sampling.py), each optional, with its type there; logprobs differs by endpoint
# (below), and JSON keys are strings, so logit_bias maps a token id written as a string to its bias.
_HTTP_TYPES = {"logit_bias": dict[str, float]}
_ENDPOINT_FIELDS = ("logprobs",)
_SamplingFields = create_model(
    "_SamplingFields", __base__=_Strict,
    **{name: (_HTTP_TYPES.get(name, kind) | None, None)
       for name, kind in get_type_hints(SamplingParams).items()
       if name in CLIENT_FIELDS and name not in _ENDPOINT_FIELDS})


class _SamplingBody(_SamplingFields):
    """The fields both endpoints take: the sampling fields (with specd's extensions num_speculative_tokens,
    logprobs_mode, repetition_penalty, top_k, min_p, ignore_eos) and OpenAI's own."""

    model: str | None = None
    stop: str | list[str] | None = None
    n: int | None = None  # choices to return (gateway/openai/choices.py)
    best_of: int | None = None  # samples to choose them from, by cumulative logprob
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # identifies the end user to OpenAI's abuse monitoring; nothing to do here

    def sampling_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SamplingFields.model_fields}

    def stop_strings(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else self.stop

    def choices(self) -> tuple[int, int]:
        """(n, best_of): how many choices to return, and how many samples to choose them from."""
        n = 1 if self.n is None else self.n
        if not 1 <= n <= MAX_CHOICES:
            raise RequestError("n", f"must be in [1, {MAX_CHOICES}], got {n}")
        best_of = n if self.best_of is None else self.best_of
        if not n <= best_of <= MAX_CHOICES:
            raise RequestError("best_of", f"must be in [n, {MAX_CHOICES}] (n = {n}), got {best_of}")
        if best_of > n and self.stream:
            raise RequestError("best_of", "cannot be used with stream: the best choices are known only at the end")
        return n, best_of

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(_SamplingBody):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | bool | None = None  # N most likely tokens per position; false (what some SDKs send) = none

    def request_fields(self) -> RequestFields:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise RequestError("prompt", "batches of prompts are not supported; send one prompt")
            prompt = prompt[0]
        fields = self.sampling_fields()
        if self.logprobs is True:
            raise RequestError("logprobs", "must be an integer (how many of the most likely tokens to list), "
                                           "not true")
        fields["logprobs"] = None if self.logprobs is False else self.logprobs
        given = dict(stop=self.stop_strings(), sampling=fields, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
                     client_names={"prompt_token_ids": "prompt"})
        if isinstance(prompt, str):
            return RequestFields(prompt=prompt, **given)
        return RequestFields(prompt_token_ids=list(prompt), **given)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it; content parts are joined into one text."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "".join(part.text for part in self.content)
        return message


class ChatCompletionBody(_SamplingBody):
    """POST /v1/chat/completions: a conversation rendered with the model's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # the current OpenAI name of max_tokens; wins over it
    logprobs: bool | None = None
    top_logprobs: int | None = None  # with logprobs: how many of the most likely tokens to list, 0..20

    def request_fields(self) -> RequestFields:
        fields = self.sampling_fields()
        names = {"logprobs": "top_logprobs"}  # the range error is about top_logprobs
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs", "needs logprobs: true")
        fields["logprobs"] = (self.top_logprobs or 0) if self.logprobs else None
        if self.max_completion_tokens is not None:
            fields["max_tokens"], names["max_tokens"] = self.max_completion_tokens, "max_completion_tokens"
        return RequestFields(messages=[m.for_template() for m in self.messages], stop=self.stop_strings(),
                             sampling=fields, client_names=names)


def parse_body(schema: type[_SamplingBody], data: dict) -> _SamplingBody:
    """`data` as `schema`; RequestError naming the field (`messages[0].content`) on a wrong type."""
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        # Of a union's alternatives, the one that got furthest says best what is wrong.
        worst = max(error.errors(), key=lambda e: len(e["loc"]))
        raise RequestError(_param(worst), _message(worst)) from None


def _param(error: dict) -> str:
    """pydantic's location as OpenAI names a parameter: field names and [indexes], no union tags."""
    loc, param = error["loc"], ""
    if loc[0] == "logit_bias" and len(loc) == 2:  # a bias of the wrong type, named by its key
        return f"logit_bias[{json.dumps(loc[1])}]"
    for index, part in enumerate(loc):
        unknown_field = error["type"] == "extra_forbidden" and index == len(loc) - 1
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in _FIELD_NAMES or unknown_field:
            param += f".{part}" if param else part
    return param or "body"


def _message(error: dict) -> str:
    if error["type"] == "extra_forbidden":
        return "is not a parameter of this endpoint"
    if error["type"] == "missing":
        return "is required"
    if error.get("input", ...) is None:
        return "must not be null"
    return error["msg"][:1].lower() + error["msg"][1:]


_FIELD_NAMES = {name for model in (CompletionBody, ChatCompletionBody, ChatMessage, TextPart, StreamOptions)
                for name in model.model_fields}
