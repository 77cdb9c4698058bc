"""The drafter's rules read literally, by scanning every position: what every store is checked against.

`brute_force_propose` is prompt lookup (drafter_service/ngram.py); `BruteForceMemory` holds remembered
outputs as plain lists (drafter_service/memory.py); `brute_force_draft` finds occurrences by scanning the
context and those lists and applies the evidence rule (drafter_service/evidence.py) to them.
"""
from __future__ import annotations

from drafter_service import evidence
from drafter_service.config import DrafterConfig


def brute_force_propose(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The rule, read literally: longest n first, most recent earlier occurrence, overlapping copy."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        for end in range(length - 1, n - 1, -1):  # end < length: an earlier occurrence
            if tokens[end - n:end] == suffix:
                draft: list[int] = []
                for j in range(k):
                    draft.append(tokens[end + j] if end + j < length else draft[j - (length - end)])
                return draft
    return []


class BruteForceMemory:
    """Remembered outputs as (partition, tokens), in two generations of at most max_tokens // 2 tokens."""

    def __init__(self, max_tokens: int) -> None:
        self.generation_tokens = max(max_tokens // 2, 1)
        self.newer: list[tuple[str, list[int]]] = []
        self.older: list[tuple[str, list[int]]] = []

    def add(self, partition: str, tokens: list[int]) -> None:
        tokens = tokens[-self.generation_tokens:]
        if sum(len(t) for _, t in self.newer) + len(tokens) > self.generation_tokens:
            self.older, self.newer = self.newer, []
        self.newer.append((partition, tokens))

    @property
    def total_tokens(self) -> int:
        return sum(len(t) for _, t in self.newer + self.older)

    def occurrences(self, partition: str, context: list[int], n: int, k: int) -> list[evidence.Occurrence]:
        """Every occurrence in `partition` of the context's last n tokens, followed by a token, latest first."""
        suffix = context[len(context) - n:]
        found = []
        for remembered_partition, tokens in reversed(self.older + self.newer):  # latest output first
            if remembered_partition != partition:
                continue
            for end in range(len(tokens) - 1, n - 1, -1):
                if tokens[end - n:end] == suffix:
                    found.append(evidence.Occurrence(tokens[max(0, end - evidence.MAX_MATCH):end], tokens[end:end + k]))
        return found


def _context_occurrences(context: list[int], n: int, k: int) -> list[evidence.Occurrence]:
    suffix, length = context[len(context) - n:], len(context)
    return [evidence.Occurrence(context[max(0, end - evidence.MAX_MATCH):end], context[end:end + k], periodic=True)
            for end in range(length - 1, n - 1, -1) if context[end - n:end] == suffix]


def brute_force_draft(context: list[int], memory: BruteForceMemory, partition: str, k: int, low: int, high: int,
                      config: DrafterConfig) -> list[int]:
    """The draft of the evidence rule (or of prompt lookup, config.drafting == "ngram") for one sequence."""
    if config.drafting == "ngram":
        return brute_force_propose(context, k, low, high)
    threshold, limit = config.min_draft_probability, evidence.CANDIDATES
    own = next((found[:limit] for n in range(min(high, len(context) - 1), low - 1, -1)
                if (found := _context_occurrences(context, n, k))), [])
    from_context = evidence.draft(context, own, k, evidence.context_prior, threshold)
    if config.memory_scope == "off":
        return from_context.tokens
    lowest = max(low, evidence.MIN_MEMORY_MATCH)
    remembered = next((found[:limit] for n in range(min(high, len(context)), lowest - 1, -1)
                       if (found := memory.occurrences(partition, context, n, k))), [])
    return evidence.better(from_context, evidence.draft(context, remembered, k, evidence.memory_prior, threshold))[0].tokens
