"""One sequence's context and its incremental n-gram index: where each n-gram occurred, latest first.

For every n in [min_n, max_n], each n-gram that is already followed by a token maps to the end position
of its latest occurrence (the position of the token after it), and each occurrence links to the one
before it (a hash chain, as in LZ77 / zlib's deflate). Appending a token indexes the n-grams that end
just before it: O(max_n - min_n + 1) dict writes. `occurrences` walks a chain, most recent first; the
evidence rule (evidence.py) reads them, and the memory of earlier outputs (memory.py) keeps the same kind
of index over many sequences.

`propose` is plain prompt lookup, the drafter's rule before it had evidence and memory, kept for
comparison (DrafterConfig.drafting = "ngram"): for n = max_n down to min_n (skipping n >= L), the most
recent earlier occurrence of the last n tokens wins, and the draft copies what followed it,
d[j] = t[e + j], where positions at or past L read the draft itself (d[j] = d[j - (L - e)]), like an LZ77
overlapping copy, so a periodic tail (a loop, a table of repeated rows) drafts all k tokens.

Storage, chosen for CPython: an n-gram is keyed by the 64-bit hash of its tuple (built in C); dicts and
lists holding only ints are invisible to the garbage collector. A match is confirmed against the tokens
before it is used, so a hash collision can only hide a match, never produce a wrong draft.
"""
from __future__ import annotations

from collections.abc import Iterable

NO_OCCURRENCE = -1  # end of a chain


class NgramIndex:
    """One sequence's context and its n-gram index for n in [min_n, max_n]."""

    def __init__(self, min_n: int, max_n: int, token_ids: Iterable[int] = ()) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"min_n, max_n: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []  # the context
        # _latest[n - min_n][hash of an n-gram's tuple] = end position of its latest indexed occurrence
        self._latest: list[dict[int, int]] = [{} for _ in range(min_n, max_n + 1)]
        # _previous[n - min_n][end] = end of the occurrence before the n-gram ending there (same hash)
        self._previous: list[dict[int, int]] = [{} for _ in range(min_n, max_n + 1)]
        self.extend(token_ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, token_ids: Iterable[int]) -> None:
        """Append tokens in order."""
        for token in token_ids:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token: the n-grams ending at the old last token now have a continuation."""
        tokens = self.tokens
        end = len(tokens)
        tail = tuple(tokens[max(0, end - self.max_n):])  # one tuple, sliced per n (this is the hot path)
        for n, latest, previous in zip(range(self.min_n, min(self.max_n, end) + 1), self._latest,
                                       self._previous):
            key = hash(tail[-n:])
            before = latest.get(key)
            if before is not None:
                previous[end] = before
            latest[key] = end
        tokens.append(token)

    def occurrences(self, n: int, limit: int) -> list[int]:
        """End positions (< len) of up to `limit` latest earlier occurrences of the last n tokens, latest first."""
        tokens = self.tokens
        length = len(tokens)
        if not self.min_n <= n < length or limit <= 0:
            return []
        suffix = tokens[length - n:]
        found: list[int] = []
        end = self._latest[n - self.min_n].get(hash(tuple(suffix)), NO_OCCURRENCE)
        previous = self._previous[n - self.min_n]
        while end != NO_OCCURRENCE and len(found) < limit:
            if tokens[end - n:end] == suffix:  # a hash collision is skipped
                found.append(end)
            end = previous.get(end, NO_OCCURRENCE)
        return found

    def propose(self, limit: int, min_n: int | None = None,
                max_n: int | None = None) -> list[int]:
        """Prompt lookup (module docstring): up to `limit` drafts; [] when nothing matches.

        min_n / max_n narrow the search (None = the index's bounds); bounds outside the indexed
        range are clamped to it, since n-grams of other lengths were never indexed.
        """
        if limit <= 0:
            return []
        low = self.min_n if min_n is None else max(min_n, self.min_n)
        high = self.max_n if max_n is None else min(max_n, self.max_n)
        for n in range(min(high, len(self.tokens) - 1), low - 1, -1):
            found = self.occurrences(n, 1)
            if found:
                return self.copy_from(found[0], limit)
        return []

    def copy_from(self, start: int, count: int) -> list[int]:
        """t[start:start+count], continuing periodically (period L - start) past the end."""
        copied = self.tokens[start:start + count]
        while len(copied) < count:
            copied.extend(copied[:count - len(copied)])
        return copied
