"""The drafter's domain: a batch of sequence deltas in, a batch of drafts out, per verifier stream.

Sequence ids are unique only within one verifier's stream (many verifiers may share a drafter), so
each stream gets a `DrafterSession` that namespaces its ids in the shared `SequenceStore` and forgets
all of them when the stream ends (the verifier re-syncs everything on a new stream anyway).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from drafter_service.config import DrafterConfig
from drafter_service.state import SequenceStore


@dataclass(slots=True)  # built per sequence per step: slots, not frozen, for speed
class SequenceDelta:
    """What a verifier step tells the drafter about one sequence (see protos/specd/v1/drafter.proto)."""

    sequence_id: str
    start: int  # length the sender believes the drafter holds; 0 = new_token_ids is the whole context
    new_token_ids: Sequence[int]
    num_draft_tokens: int  # 0 only updates state
    min_ngram: int = 0  # 0 = the drafter's default
    max_ngram: int = 0


@dataclass(slots=True)
class ProposeBatch:
    step_id: int
    sequences: Sequence[SequenceDelta]
    released_sequence_ids: Sequence[str] = ()


@dataclass(slots=True)  # built per sequence per step: slots, not frozen, for speed
class SequenceDraft:
    sequence_id: str
    draft_token_ids: list[int]
    resync: bool = False  # the drafter does not hold this context: send it whole (start = 0) next time


@dataclass(slots=True)
class DraftBatch:
    step_id: int
    drafts: list[SequenceDraft] = field(default_factory=list)  # one per request sequence, in order

    @property
    def num_draft_tokens(self) -> int:
        return sum(len(d.draft_token_ids) for d in self.drafts)


class Drafter:
    """The shared store of every stream's sequences, and the service defaults."""

    def __init__(self, config: DrafterConfig) -> None:
        self.config = config
        self.store = SequenceStore(config.max_ngram, config.max_tokens_held)
        self._session_numbers = itertools.count()

    def open_session(self) -> DrafterSession:
        """A namespace for one verifier stream's sequence ids."""
        return DrafterSession(self, next(self._session_numbers))


class DrafterSession:
    """One verifier stream: applies its deltas and proposes, in request order."""

    def __init__(self, drafter: Drafter, number: int) -> None:
        self._drafter = drafter
        self._number = number
        self._sequence_ids: set[str] = set()

    def step(self, batch: ProposeBatch) -> DraftBatch:
        """Release, then update and propose for every sequence of the batch."""
        store = self._drafter.store
        for sequence_id in batch.released_sequence_ids:
            store.release((self._number, sequence_id))
            self._sequence_ids.discard(sequence_id)
        return DraftBatch(batch.step_id, [self._propose(delta) for delta in batch.sequences])

    def _propose(self, delta: SequenceDelta) -> SequenceDraft:
        self._sequence_ids.add(delta.sequence_id)
        index = self._drafter.store.apply((self._number, delta.sequence_id), delta.start,
                                          delta.new_token_ids)
        if index is None:
            return SequenceDraft(delta.sequence_id, [], resync=True)
        config = self._drafter.config
        draft = index.propose(min(delta.num_draft_tokens, config.max_draft_tokens),
                              delta.min_ngram or config.min_ngram, delta.max_ngram or config.max_ngram)
        return SequenceDraft(delta.sequence_id, draft)

    def close(self) -> None:
        """Forget every sequence of this stream."""
        for sequence_id in self._sequence_ids:
            self._drafter.store.release((self._number, sequence_id))
        self._sequence_ids.clear()
