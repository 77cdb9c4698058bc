"""Per-sequence contexts, keyed by id, with bounded memory.

The verifier sends each sequence's context once (start = 0) and then only what was appended
(start = the length it believes the drafter holds). A start that does not match the held length, or
a sequence the drafter does not hold (never seen, released, evicted), is answered with a request to
re-sync: no drafts this step, the whole context next step. Never an error: the drafter can always
be brought back in step by resending.

Memory is bounded by the total number of tokens held; when a new token would exceed it, the least
recently used sequences are dropped (they will simply be re-synced if they come back).

This is the reference implementation and the fallback of the native store (native_store.cpp, same
rules, one call per batch); drafter_service/stores.py chooses between them.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from itertools import repeat

from drafter_service.batch import DraftBatch, ProposeBatch
from drafter_service.config import DrafterConfig
from drafter_service.ngram import NgramIndex


class SequenceStore:
    """Holds one NgramIndex per sequence key, least recently used first."""

    def __init__(self, max_ngram: int, max_tokens_held: int) -> None:
        self.max_ngram = max_ngram
        self.max_tokens_held = max_tokens_held
        self._indexes: OrderedDict[Hashable, NgramIndex] = OrderedDict()
        self.total_tokens = 0
        self.num_evicted = 0  # sequences dropped to stay under max_tokens_held, ever

    def __len__(self) -> int:
        return len(self._indexes)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._indexes

    def apply(self, key: Hashable, start: int, new_token_ids: Sequence[int]) -> NgramIndex | None:
        """Bring a sequence up to date; None when it must be re-synced (nothing held matches start)."""
        if start == 0:
            self.release(key)
            index = NgramIndex(1, self.max_ngram)
            self._indexes[key] = index
        else:
            index = self._indexes.get(key)
            if index is None:
                return None
            if len(index.tokens) != start:
                self.release(key)  # out of step: what we hold is of no use until the resend
                return None
            self._indexes.move_to_end(key)
        index.extend(new_token_ids)
        self.total_tokens += len(new_token_ids)
        if self.total_tokens > self.max_tokens_held:
            self._evict_beyond_budget()
            return self._indexes.get(key)  # None if it alone outgrew the budget
        return index

    def release(self, key: Hashable) -> None:
        """Forget a sequence (finished, aborted, or its stream closed); unknown keys are ignored."""
        index = self._indexes.pop(key, None)
        if index is not None:
            self.total_tokens -= len(index)

    def propose_batch(self, session: int, batch: ProposeBatch, config: DrafterConfig) -> DraftBatch:
        """Apply every delta of a (checked) batch and propose, in order; keys are (session, sequence id)."""
        counts: list[int] = []
        drafts: list[int] = []
        resync: list[str] = []
        tokens, position = batch.new_token_ids, 0
        columns = zip(batch.sequence_ids, batch.starts, batch.new_token_counts, batch.num_draft_tokens,
                      batch.min_ngrams or repeat(0), batch.max_ngrams or repeat(0))
        for sequence_id, start, count, k, min_ngram, max_ngram in columns:
            index = self.apply((session, sequence_id), start, tokens[position:position + count])
            position += count
            if index is None:
                resync.append(sequence_id)
                counts.append(0)
                continue
            draft = index.propose(min(k, config.max_draft_tokens), min_ngram or config.min_ngram,
                                  max_ngram or config.max_ngram)
            counts.append(len(draft))
            drafts.extend(draft)
        return DraftBatch(batch.step_id, counts, drafts, resync)

    def release_sequences(self, session: int, sequence_ids: Sequence[str]) -> None:
        """Forget some of a session's sequences."""
        for sequence_id in sequence_ids:
            self.release((session, sequence_id))

    def release_session(self, session: int) -> None:
        """Forget every sequence of a session (its stream closed)."""
        for key in [k for k in self._indexes if isinstance(k, tuple) and k[0] == session]:
            self.release(key)

    def held_tokens(self, session: int, sequence_id: str) -> list[int] | None:
        """The context held for a session's sequence (None if not held)."""
        index = self._indexes.get((session, sequence_id))
        return None if index is None else list(index.tokens)

    def _evict_beyond_budget(self) -> None:
        """Drop least recently used sequences until the budget holds (the one just used goes last)."""
        while self.total_tokens > self.max_tokens_held:
            self.release(next(iter(self._indexes)))
            self.num_evicted += 1
