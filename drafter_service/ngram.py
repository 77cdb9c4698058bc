"""Prompt lookup (n-gram) drafting over an incremental index, one per sequence.

The proposal rule, for a context t[0:L), k draft tokens and bounds min_n <= n <= max_n:

  For n = max_n down to min_n (skipping n >= L, which has no earlier occurrence), take the suffix
  s = t[L-n:L] and find its *most recent earlier occurrence*: the largest end position e < L with
  t[e-n:e] == s (it may overlap the suffix itself). The first n that has one wins, and the draft is
  what followed that occurrence: d[j] = t[e+j] for j < k, where positions at or past L read the draft
  itself (d[j] = d[j-(L-e)]), like an LZ77 overlapping copy. No n matches: no draft.

Why the most recent occurrence: text repeats locally (the lines being edited, the list being
continued, the phrase the model just produced), so the closest earlier copy is the best predictor of
what comes next; it is also the one an index can keep in O(1) by overwriting. Why the overlapping
copy: for a periodic tail (a model stuck in a loop, a table of repeated rows) the most recent
occurrence is one period back, so plain copying would stop after one period; continuing the period
drafts all k tokens, and those are exactly the tokens the loop will produce.

The index keeps, for every n in [min_n, max_n], a dict from each n-gram to the end position of its
latest occurrence that is already followed by a token. Appending one token indexes the n-grams that
end just before it (O(max_n - min_n + 1) dict writes); a proposal looks up at most max_n - min_n + 1
suffixes and copies k tokens (O(max_n + k)). Neither depends on the context length.

Storage, chosen for CPython: an n-gram is keyed by the 64-bit hash of its tuple (built in C, 3-5x
faster than packing ids with Python arithmetic). Dicts holding only ints are invisible to the
garbage collector, so a store of millions of tokens adds no GC pauses (with tuple keys, full
collections made the p99 batch time 50x the median); about 420 bytes per held token at max_n = 4
when all n-grams are distinct. A match is confirmed against the tokens before it is used, so a hash
collision can only hide a match (then a shorter n is tried), never produce a wrong draft.
"""
from __future__ import annotations

from collections.abc import Iterable

_APPEND_ONE_BY_ONE_UP_TO = 8  # below this many new tokens, slicing per n costs more than it saves


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
        self.extend(token_ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, token_ids: Iterable[int]) -> None:
        """Append tokens in order, indexing each n-gram once it is followed by a token.

        Same result as append() per token; the n-grams are built with slices and zip, in C, which
        makes a first-sight context of 32k tokens about 3x cheaper to index.
        """
        token_ids = list(token_ids)
        if len(token_ids) <= _APPEND_ONE_BY_ONE_UP_TO:
            for token in token_ids:
                self.append(token)
            return
        tokens = self.tokens
        old_length = len(tokens)
        tokens.extend(token_ids)
        new_length = len(tokens)
        for n, latest in zip(range(self.min_n, self.max_n + 1), self._latest):
            # n-grams ending at e in [max(old_length, n), new_length) are newly followed by a token;
            # updating in increasing e keeps the most recent occurrence of each.
            first_end = max(old_length, n)
            columns = [tokens[first_end - n + i:new_length - n + i] for i in range(n)]
            latest.update(zip(map(hash, zip(*columns)), range(first_end, new_length)))

    def append(self, token: int) -> None:
        """Append one token: the n-grams ending at the old last token now have a continuation."""
        tokens = self.tokens
        end = len(tokens)
        tail = tuple(tokens[max(0, end - self.max_n):])  # one tuple, sliced per n (this is the hot path)
        for n, latest in zip(range(self.min_n, min(self.max_n, end) + 1), self._latest):
            latest[hash(tail[-n:])] = end
        tokens.append(token)

    def propose(self, num_draft_tokens: int, min_n: int | None = None,
                max_n: int | None = None) -> list[int]:
        """Up to num_draft_tokens drafts by the rule in the module docstring; [] when nothing matches.

        min_n / max_n narrow the search (None = the index's bounds); bounds outside the indexed
        range are clamped to it, since n-grams of other lengths were never indexed.
        """
        if num_draft_tokens <= 0:
            return []
        low = self.min_n if min_n is None else max(min_n, self.min_n)
        high = self.max_n if max_n is None else min(max_n, self.max_n)
        tokens = self.tokens
        length = len(tokens)
        for n in range(min(high, length - 1), low - 1, -1):
            suffix = tokens[length - n:]
            end = self._latest[n - self.min_n].get(hash(tuple(suffix)))
            if end is not None and tokens[end - n:end] == suffix:
                return self._copy_from(end, num_draft_tokens)
        return []

    def _copy_from(self, start: int, count: int) -> list[int]:
        """t[start:start+count], continuing periodically (period L - start) past the end."""
        copied = self.tokens[start:start + count]
        while len(copied) < count:
            copied.extend(copied[:count - len(copied)])
        return copied
