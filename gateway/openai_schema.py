"""The OpenAI request bodies the HTTP API accepts (types only; ranges are checked in validation.py)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.validation import RequestError, RequestFields


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingBody(BaseModel):
    # Unknown OpenAI fields (user, logit_bias, ...) are accepted and ignored, as vLLM does.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    num_speculative_tokens: int | None = None  # specd extension: 0 = speculation off

    def sampling_fields(self) -> dict[str, Any]:
        if self.n != 1:
            raise RequestError("n", "only n = 1 is supported")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return dict(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                    top_k=self.top_k, min_p=self.min_p, seed=self.seed, stop=stop,
                    ignore_eos=self.ignore_eos, num_speculative_tokens=self.num_speculative_tokens)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(_SamplingBody):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]

    def request_fields(self) -> RequestFields:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise RequestError("prompt", "batches of prompts are not supported; send one prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return RequestFields(prompt=prompt, **self.sampling_fields())
        return RequestFields(prompt_token_ids=list(prompt), **self.sampling_fields())


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ... pass through to the template

    role: str
    content: str | list[dict[str, Any]] | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it; content parts are joined into one text."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "".join(part.get("text", "") for part in self.content
                                         if part.get("type") == "text")
        return message


class ChatCompletionBody(_SamplingBody):
    """POST /v1/chat/completions: a conversation rendered with the model's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None)  # the newer OpenAI name of max_tokens

    def request_fields(self) -> RequestFields:
        fields = self.sampling_fields()
        if fields["max_tokens"] is None:
            fields["max_tokens"] = self.max_completion_tokens
        return RequestFields(messages=[m.for_template() for m in self.messages], **fields)
