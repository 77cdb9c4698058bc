"""The prompt-lookup rule of drafter_service/ngram.py read literally: what every store is checked against."""
from __future__ import annotations


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
