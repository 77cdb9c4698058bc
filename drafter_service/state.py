"""Per-sequence contexts, keyed by id, with bounded memory; drafting from them and from the memory.

The verifier sends each sequence's context once (start = 0) and then only what was appended
(start = the length it believes the drafter holds). A start that does not match the held length, or
a sequence the drafter does not hold (never seen, released, evicted), is answered with a request to
re-sync: no drafts this step, the whole context next step. Never an error: the drafter can always
be brought back in step by resending.

Memory is bounded by the total number of tokens held; when a new token would exceed it, the least
recently used sequences are dropped (they will simply be re-synced if they come back). A released
sequence's output goes to the memory of earlier outputs (memory.py) unless its scope is off.

This is the reference implementation and the fallback of the native store (native_store.cpp, same
rules, one call per batch); drafter_service/stores.py chooses between them.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import repeat

from drafter_service import evidence, tree
from drafter_service.batch import DraftBatch, ProposeBatch
from drafter_service.config import DrafterConfig
from drafter_service.memory import OutputMemory
from drafter_service.ngram import NgramIndex


@dataclass
class _Held:
    index: NgramIndex
    first_sight: int  # tokens of its start = 0 delta: the prompt (and the prefill's token); later ones are output
    partition: str  # its part of the memory ("" unless the scope is per-key)


class SequenceStore:
    """Holds one NgramIndex per sequence key, least recently used first, and the memory of outputs."""

    def __init__(self, config: DrafterConfig) -> None:
        self.config = config
        self._held: OrderedDict[Hashable, _Held] = OrderedDict()
        self.memory = OutputMemory(config.max_ngram, config.max_memory_tokens)
        self.total_tokens = 0
        self.num_evicted = 0  # sequences dropped to stay under max_tokens_held, ever

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._held

    @property
    def memory_tokens(self) -> int:
        return self.memory.total_tokens

    def apply(self, key: Hashable, start: int, new_token_ids: Sequence[int], tenant_key: str = "") -> _Held | None:
        """Bring a sequence up to date; None when it must be re-synced (nothing held matches start)."""
        if start == 0:
            self._drop(key)
            partition = tenant_key if self.config.memory_scope == "per-key" else ""
            held = self._held[key] = _Held(NgramIndex(1, self.config.max_ngram), len(new_token_ids), partition)
        else:
            held = self._held.get(key)
            if held is None:
                return None
            if len(held.index) != start:
                self._drop(key)  # out of step: what we hold is of no use until the resend
                return None
            self._held.move_to_end(key)
        held.index.extend(new_token_ids)
        self.total_tokens += len(new_token_ids)
        if self.total_tokens > self.config.max_tokens_held:
            self._evict_beyond_budget()
            return self._held.get(key)  # None if it alone outgrew the budget
        return held

    def release(self, key: Hashable) -> None:
        """Forget a finished or aborted sequence, remembering its output; unknown keys are ignored."""
        held = self._drop(key)
        config = self.config
        if held is None or config.memory_scope == "off" or config.drafting == "ngram" or len(held.index) <= held.first_sight:
            return
        self.memory.add(held.partition, held.index.tokens[max(held.first_sight - config.max_ngram, 0):])

    def propose_batch(self, session: int, batch: ProposeBatch) -> DraftBatch:
        """Apply every delta of a (checked) batch and propose, in order; keys are (session, sequence id)."""
        config = self.config
        result = DraftBatch(batch.step_id, draft_length_counts=[0] * (config.max_draft_tokens + 1))
        tokens, position = batch.new_token_ids, 0
        columns = zip(batch.sequence_ids, batch.starts, batch.new_token_counts, batch.draft_limits,
                      batch.min_ngrams or repeat(0), batch.max_ngrams or repeat(0), batch.tenant_keys or repeat(""))
        for sequence_id, start, count, k, min_ngram, max_ngram, tenant_key in columns:
            held = self.apply((session, sequence_id), start, tokens[position:position + count], tenant_key)
            position += count
            if held is None:
                result.resync_sequence_ids.append(sequence_id)
                result.draft_counts.append(0)
                continue
            k = min(k, config.max_draft_tokens)
            low, high = max(min_ngram or config.min_ngram, 1), min(max_ngram or config.max_ngram, config.max_ngram)
            draft, source = self._draft(held, k, low, high) if k > 0 and low <= high else ([], 0)
            result.draft_counts.append(len(draft))
            result.draft_token_ids.extend(draft)
            result.memory_draft_tokens += len(draft) * source
            result.draft_length_counts[len(draft)] += k > 0
        return result

    def _draft(self, held: _Held, k: int, low: int, high: int) -> tuple[list[int], int]:
        """(draft, 0 if from the context else 1) by the drafting rule in force."""
        config, index = self.config, held.index
        if config.drafting == "ngram":
            return index.propose(k, low, high), 0
        context = index.tokens
        from_context = evidence.draft(context, _context_occurrences(index, low, high, k), k,
                                      evidence.context_prior, config.min_draft_probability)
        if config.memory_scope == "off":
            return from_context.tokens, 0
        remembered = self._remembered(held, low, high, evidence.CANDIDATES, k)
        from_memory = evidence.draft(context, remembered, k, evidence.memory_prior, config.min_draft_probability)
        chosen, source = evidence.better(from_context, from_memory)
        return chosen.tokens, source

    def _remembered(self, held: _Held, low: int, high: int, limit: int, k: int) -> list[evidence.Occurrence]:
        """The latest `limit` occurrences in the memory of the context's longest suffix in [low, high] (at least
        MIN_MEMORY_MATCH tokens), with up to k tokens after each."""
        context = held.index.tokens
        for n in range(min(high, len(context)), max(low, evidence.MIN_MEMORY_MATCH) - 1, -1):
            if found := self.memory.occurrences(held.partition, context, n, limit, k):
                return found
        return []

    def draft_tree(self, key: Hashable, budget: int, depth: int, threshold: float | None = None,
                   candidates: int = tree.CANDIDATES) -> tree.DraftTree:
        """A draft tree (tree.py) of at most `budget` nodes and `depth` levels for a held sequence, from the
        latest `candidates` occurrences of its suffix in its context and in the memory; nodes of a chance
        below `threshold` (None: the drafter's min_draft_probability) are left out."""
        held, config = self._held.get(key), self.config
        if held is None:
            return tree.DraftTree()
        context, low, high = held.index.tokens, config.min_ngram, config.max_ngram
        sources = [(_context_occurrences(held.index, low, high, depth, candidates), evidence.context_prior)]
        if config.memory_scope != "off":
            sources.append((self._remembered(held, low, high, candidates, depth), evidence.memory_prior))
        threshold = config.min_draft_probability if threshold is None else threshold
        return tree.build_tree(context, sources, budget, depth, threshold)

    def release_sequences(self, session: int, sequence_ids: Sequence[str]) -> None:
        """Forget some of a session's sequences (finished or aborted: their outputs are remembered)."""
        for sequence_id in sequence_ids:
            self.release((session, sequence_id))

    def release_session(self, session: int) -> None:
        """Forget every sequence of a session (its stream closed; they are not remembered)."""
        for key in [k for k in self._held if isinstance(k, tuple) and k[0] == session]:
            self._drop(key)

    def held_tokens(self, session: int, sequence_id: str) -> list[int] | None:
        """The context held for a session's sequence (None if not held)."""
        held = self._held.get((session, sequence_id))
        return None if held is None else list(held.index.tokens)

    def _drop(self, key: Hashable) -> _Held | None:
        held = self._held.pop(key, None)
        if held is not None:
            self.total_tokens -= len(held.index)
        return held

    def _evict_beyond_budget(self) -> None:
        """Drop least recently used sequences until the budget holds (the one just used goes last)."""
        while self.total_tokens > self.config.max_tokens_held:
            self._drop(next(iter(self._held)))
            self.num_evicted += 1


def _context_occurrences(index: NgramIndex, low: int, high: int, k: int,
                         candidates: int = evidence.CANDIDATES) -> list[evidence.Occurrence]:
    """The latest occurrences of the context's longest suffix in [low, high] that occurred before."""
    tokens = index.tokens
    for n in range(min(high, len(tokens) - 1), low - 1, -1):
        ends = index.occurrences(n, candidates)
        if ends:
            return [evidence.Occurrence(tokens[max(end - evidence.MAX_MATCH, 0):end], tokens[end:end + k],
                                        periodic=True) for end in ends]
    return []
