from specd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServeRequest(_message.Message):
    __slots__ = ("starts", "abort_request_ids")
    STARTS_FIELD_NUMBER: _ClassVar[int]
    ABORT_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    starts: _containers.RepeatedCompositeFieldContainer[ServeStart]
    abort_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, starts: _Optional[_Iterable[_Union[ServeStart, _Mapping]]] = ..., abort_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ServeStart(_message.Message):
    __slots__ = ("request", "timeout_seconds")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request: VerifierGenerateRequest
    timeout_seconds: float
    def __init__(self, request: _Optional[_Union[VerifierGenerateRequest, _Mapping]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class ServeResponse(_message.Message):
    __slots__ = ("request_ids", "token_counts", "token_ids", "finish_reasons", "prompt_tokens", "completion_tokens", "draft_tokens", "accepted_tokens", "steps", "num_speculative_tokens", "seeds", "logprobs", "errors")
    class SeedsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class LogprobsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: TokenLogprobsList
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[TokenLogprobsList, _Mapping]] = ...) -> None: ...
    class ErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: RequestError
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[RequestError, _Mapping]] = ...) -> None: ...
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    token_counts: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reasons: _containers.RepeatedScalarFieldContainer[str]
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    completion_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    accepted_tokens: _containers.RepeatedScalarFieldContainer[int]
    steps: _containers.RepeatedScalarFieldContainer[int]
    num_speculative_tokens: _containers.RepeatedScalarFieldContainer[int]
    seeds: _containers.ScalarMap[int, int]
    logprobs: _containers.MessageMap[int, TokenLogprobsList]
    errors: _containers.MessageMap[int, RequestError]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., token_counts: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reasons: _Optional[_Iterable[str]] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., completion_tokens: _Optional[_Iterable[int]] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., accepted_tokens: _Optional[_Iterable[int]] = ..., steps: _Optional[_Iterable[int]] = ..., num_speculative_tokens: _Optional[_Iterable[int]] = ..., seeds: _Optional[_Mapping[int, int]] = ..., logprobs: _Optional[_Mapping[int, TokenLogprobsList]] = ..., errors: _Optional[_Mapping[int, RequestError]] = ...) -> None: ...

class TokenLogprobsList(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class RequestError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class VerifierGenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "tenant_key")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    tenant_key: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., tenant_key: _Optional[str] = ...) -> None: ...

class VerifierGenerateResponse(_message.Message):
    __slots__ = ("token_ids", "finish_reason", "usage", "seed", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: _common_pb2.Usage
    seed: int
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., seed: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("num_running", "num_waiting", "kv_cache_usage", "num_used_blocks", "num_total_blocks", "model", "max_model_len", "serve_port")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    SERVE_PORT_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_used_blocks: int
    num_total_blocks: int
    model: str
    max_model_len: int
    serve_port: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., num_used_blocks: _Optional[int] = ..., num_total_blocks: _Optional[int] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., serve_port: _Optional[int] = ...) -> None: ...
