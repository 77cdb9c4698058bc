from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProposeRequest(_message.Message):
    __slots__ = ("step_id", "sequences", "released_sequence_ids")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    sequences: _containers.RepeatedCompositeFieldContainer[SequenceDelta]
    released_sequence_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step_id: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[SequenceDelta, _Mapping]]] = ..., released_sequence_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SequenceDelta(_message.Message):
    __slots__ = ("sequence_id", "start", "new_token_ids", "num_draft_tokens", "min_ngram", "max_ngram")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NGRAM_FIELD_NUMBER: _ClassVar[int]
    MAX_NGRAM_FIELD_NUMBER: _ClassVar[int]
    sequence_id: str
    start: int
    new_token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_draft_tokens: int
    min_ngram: int
    max_ngram: int
    def __init__(self, sequence_id: _Optional[str] = ..., start: _Optional[int] = ..., new_token_ids: _Optional[_Iterable[int]] = ..., num_draft_tokens: _Optional[int] = ..., min_ngram: _Optional[int] = ..., max_ngram: _Optional[int] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("step_id", "drafts")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    drafts: _containers.RepeatedCompositeFieldContainer[SequenceDraft]
    def __init__(self, step_id: _Optional[int] = ..., drafts: _Optional[_Iterable[_Union[SequenceDraft, _Mapping]]] = ...) -> None: ...

class SequenceDraft(_message.Message):
    __slots__ = ("sequence_id", "draft_token_ids", "resync")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    sequence_id: str
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    resync: bool
    def __init__(self, sequence_id: _Optional[str] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., resync: _Optional[bool] = ...) -> None: ...
