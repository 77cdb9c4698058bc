"""One verifier step as the drafter sees it: columns in (`ProposeBatch`), columns out (`DraftBatch`).

Why columns rather than one object per sequence: at 256 sequences a step, building and reading
per-sequence objects cost more than the drafting itself (1-2 us each in Python, on both ends of the
wire). Columns travel through protobuf (protos/specd/v1/drafter.proto has the same shape) and into the
native store as whole arrays. `SequenceDelta` and `DraftBatch.drafts()` are the per-sequence view, for
tests and readers.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MAX_TENANT_KEY_CHARS = 128  # the gateway sends 32 hex digits


@dataclass(frozen=True)
class DraftRequest:
    """One request's need for drafts this step, as a verifier's engine asks any proposer (this drafter over
    gRPC or in-process, or the tests' oracles)."""

    request_id: str
    token_ids: Sequence[int]  # the whole context so far: prompt + generated tokens (do not mutate)
    draft_limit: int  # the most drafts it may get this step (already capped by max_tokens / model len)
    min_ngram: int = 0  # 0 = the proposer's default
    max_ngram: int = 0
    tenant_key: str = ""  # whose memory of earlier outputs may draft it (the drafter's per-key scope)


@dataclass(frozen=True)
class SequenceDelta:
    """One sequence's part of a step, spelled out (ProposeBatch.from_deltas builds the columns)."""

    sequence_id: str
    start: int  # length the sender believes the drafter holds; 0 = new_token_ids is the whole context
    new_token_ids: Sequence[int]
    draft_limit: int  # the most drafts it may get; 0 only updates state
    min_ngram: int = 0  # 0 = the drafter's default
    max_ngram: int = 0
    tenant_key: str = ""  # read where start = 0: its partition of the memory in the per-key scope


@dataclass(slots=True)
class ProposeBatch:
    """Every column has one entry per sequence, in order, except where noted."""

    step_id: int
    sequence_ids: Sequence[str]  # unique per verifier stream
    starts: Sequence[int]  # see SequenceDelta.start
    new_token_counts: Sequence[int]  # how many of new_token_ids belong to each sequence
    new_token_ids: Sequence[int]  # every sequence's new tokens, concatenated in sequence order
    draft_limits: Sequence[int]  # the most drafts each may get; 0 only updates state
    min_ngrams: Sequence[int] = ()  # 0 = the drafter's default; an empty column = defaults for all
    max_ngrams: Sequence[int] = ()
    released_sequence_ids: Sequence[str] = ()  # forgotten (outputs remembered) before the sequences are applied
    tenant_keys: Sequence[str] = ()  # read where start = 0; an empty column = "" for all

    @classmethod
    def from_deltas(cls, step_id: int, deltas: Iterable[SequenceDelta],
                    released_sequence_ids: Sequence[str] = ()) -> ProposeBatch:
        deltas = list(deltas)
        return cls(step_id, [d.sequence_id for d in deltas], [d.start for d in deltas],
                   [len(d.new_token_ids) for d in deltas], [t for d in deltas for t in d.new_token_ids],
                   [d.draft_limit for d in deltas], [d.min_ngram for d in deltas],
                   [d.max_ngram for d in deltas], released_sequence_ids, [d.tenant_key for d in deltas])

    def column_error(self) -> tuple[str, str] | None:
        """(column, what is wrong) when the columns do not line up, else None."""
        count = len(self.sequence_ids)
        for name in ("starts", "new_token_counts", "draft_limits"):
            if len(getattr(self, name)) != count:
                return name, "needs one entry per sequence_ids entry"
        for name in ("min_ngrams", "max_ngrams", "tenant_keys"):
            if len(getattr(self, name)) not in (0, count):
                return name, "needs one entry per sequence_ids entry, or none"
        if sum(self.new_token_counts) != len(self.new_token_ids):
            return "new_token_ids", "length is not the sum of new_token_counts"
        if any(len(key) > MAX_TENANT_KEY_CHARS for key in self.tenant_keys):
            return "tenant_keys", f"each must be at most {MAX_TENANT_KEY_CHARS} characters"
        return None


@dataclass(slots=True)
class DraftBatch:
    """The answer to a ProposeBatch, in its sequence order."""

    step_id: int
    draft_counts: list[int] = field(default_factory=list)  # per sequence; 0 = no draft
    draft_token_ids: list[int] = field(default_factory=list)  # every draft, concatenated in order
    resync_sequence_ids: list[str] = field(default_factory=list)  # not held: send whole (start = 0)
    memory_draft_tokens: int = 0  # of draft_token_ids, those copied from the memory (the rest: own contexts)
    draft_length_counts: list[int] = field(default_factory=list)  # [n]: sequences that asked and got n tokens

    @property
    def num_proposed_tokens(self) -> int:
        """Drafts proposed in all (each sequence gets at most its draft limit)."""
        return len(self.draft_token_ids)

    def drafts(self) -> list[list[int]]:
        """Each sequence's draft, in order."""
        drafts, position = [], 0
        for count in self.draft_counts:
            drafts.append(self.draft_token_ids[position:position + count])
            position += count
        return drafts
