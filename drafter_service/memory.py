"""The drafter's memory of earlier outputs, shared by every stream connected to the drafter.

When a verifier releases a finished (or aborted) sequence, the tokens it generated are remembered: every
token that reached the drafter after its first sight, preceded by the last max_n tokens of that first
sight (the prompt's end: so that a remembered output can also draft the start of the next one, right
after the prefill). The memory indexes every n-gram of length 1..max_n inside each remembered output,
with a chain from each occurrence to the one before (ngram.py's scheme over many outputs), so drafting
asks it for the latest occurrences of a context's suffix, as it asks the context itself (evidence.py).
Sequences evicted for space or dropped with their stream are not remembered (they did not finish here).

Partitions keep tenants apart: an output is remembered under its sequence's partition ("" for all in
the global scope, the tenant key in the per-key scope) and only ever matched for sequences of the same
partition; the partition is part of every index key and is compared again on every match.

Bounded by tokens held: two generations of at most max_tokens / 2 each; when the newer one would
overflow it becomes the older one and the old older one is dropped whole (O(1), no rebuild; between
half and all of the budget is held). An output longer than a generation keeps its last tokens.

This is the reference; native_store.cpp implements the same memory, and tests/drafter compares them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from drafter_service.evidence import MAX_MATCH, Occurrence


@dataclass
class _Generation:
    tokens: list[int] = field(default_factory=list)
    segment_of: list[int] = field(default_factory=list)  # per position: index into segments
    segments: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, partition)
    # (partition, n-gram) -> end positions of its occurrences followed by a token, oldest first
    ends: dict[tuple[str, tuple[int, ...]], list[int]] = field(default_factory=dict)


class OutputMemory:
    """Remembered outputs in partitions, with an n-gram index for n in [1, max_n]."""

    def __init__(self, max_n: int, max_tokens: int) -> None:
        self.max_n = max_n
        self.generation_tokens = max(max_tokens // 2, 1)
        self._newer = _Generation()
        self._older = _Generation()

    @property
    def total_tokens(self) -> int:
        return len(self._newer.tokens) + len(self._older.tokens)

    def add(self, partition: str, tokens: Sequence[int]) -> None:
        """Remember one output (with its lead-in) under `partition`."""
        tokens = list(tokens[-self.generation_tokens:])
        if len(self._newer.tokens) + len(tokens) > self.generation_tokens:
            self._older, self._newer = self._newer, _Generation()
        generation = self._newer
        start = len(generation.tokens)
        generation.tokens += tokens
        generation.segment_of += [len(generation.segments)] * len(tokens)
        generation.segments.append((start, start + len(tokens), partition))
        for end in range(start + 1, start + len(tokens)):  # n-grams followed by a token of this output
            for n in range(1, min(self.max_n, end - start) + 1):
                key = (partition, tuple(generation.tokens[end - n:end]))
                generation.ends.setdefault(key, []).append(end)

    def occurrences(self, partition: str, context: Sequence[int], n: int, limit: int,
                    k: int) -> list[Occurrence]:
        """Up to `limit` latest occurrences of the context's last n tokens in `partition`, latest first."""
        if not 1 <= n <= min(self.max_n, len(context)):
            return []
        key = (partition, tuple(context[len(context) - n:]))
        found = []
        for generation in (self._newer, self._older):
            for end in reversed(generation.ends.get(key, ())):
                if len(found) == limit:
                    return found
                start, stop, _ = generation.segments[generation.segment_of[end]]
                found.append(Occurrence(before=generation.tokens[max(start, end - MAX_MATCH):end],
                                        after=generation.tokens[end:min(stop, end + k)]))
        return found
