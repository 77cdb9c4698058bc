from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ProposeRequest(_message.Message):
    __slots__ = ("step_id", "released_sequence_ids", "sequence_ids", "starts", "new_token_counts", "new_token_ids", "draft_limits", "min_ngrams", "max_ngrams", "tenant_keys")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LIMITS_FIELD_NUMBER: _ClassVar[int]
    MIN_NGRAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_NGRAMS_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEYS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    released_sequence_ids: _containers.RepeatedScalarFieldContainer[str]
    sequence_ids: _containers.RepeatedScalarFieldContainer[str]
    starts: _containers.RepeatedScalarFieldContainer[int]
    new_token_counts: _containers.RepeatedScalarFieldContainer[int]
    new_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_limits: _containers.RepeatedScalarFieldContainer[int]
    min_ngrams: _containers.RepeatedScalarFieldContainer[int]
    max_ngrams: _containers.RepeatedScalarFieldContainer[int]
    tenant_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step_id: _Optional[int] = ..., released_sequence_ids: _Optional[_Iterable[str]] = ..., sequence_ids: _Optional[_Iterable[str]] = ..., starts: _Optional[_Iterable[int]] = ..., new_token_counts: _Optional[_Iterable[int]] = ..., new_token_ids: _Optional[_Iterable[int]] = ..., draft_limits: _Optional[_Iterable[int]] = ..., min_ngrams: _Optional[_Iterable[int]] = ..., max_ngrams: _Optional[_Iterable[int]] = ..., tenant_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("step_id", "draft_counts", "draft_token_ids", "resync_sequence_ids")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_COUNTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    draft_counts: _containers.RepeatedScalarFieldContainer[int]
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    resync_sequence_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step_id: _Optional[int] = ..., draft_counts: _Optional[_Iterable[int]] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., resync_sequence_ids: _Optional[_Iterable[str]] = ...) -> None: ...
