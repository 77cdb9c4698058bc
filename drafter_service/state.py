"""Per-sequence contexts, keyed by id, with bounded memory.

The verifier sends each sequence's context once (start = 0) and then only what was appended
(start = the length it believes the drafter holds). A start that does not match the held length, or
a sequence the drafter does not hold (never seen, released, evicted), is answered with a request to
re-sync: no drafts this step, the whole context next step. Never an error: the drafter can always
be brought back in step by resending.

Memory is bounded by the total number of tokens held; when a new token would exceed it, the least
recently used sequences are dropped (they will simply be re-synced if they come back).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

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

    def _evict_beyond_budget(self) -> None:
        """Drop least recently used sequences until the budget holds (the one just used goes last)."""
        while self.total_tokens > self.max_tokens_held:
            self.release(next(iter(self._indexes)))
            self.num_evicted += 1
