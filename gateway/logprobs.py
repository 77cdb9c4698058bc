"""Logprobs that travel with the text they belong to.

The gateway holds text back: an unfinished UTF-8 character until its last byte arrives (detokenizer.py), text
that may begin a stop string until the next tokens show whether it does (stop.py), and a stop string is never
sent. A token's logprobs go out in the chunk that sends the start of its text, so a client that streams sees
each token's logprobs with its text. Where a character spans tokens, each token starts at the character its
first byte is in (so the text_offset of the last two of the three tokens of an emoji is the emoji's). Tokens
whose text starts at or after a stop string are dropped with it; one whose text starts before it is sent
(its text was, in part). At the end of a stream that no stop string cut, every token left is sent (an
end-of-sequence token, which has no text, say).
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from gateway.request import SentLogprobs, TokenCandidate, TokenLogprobs
from gateway.token_text import TokenTexts


class LogprobsAligner:
    """One request's logprobs, held until the text they belong to is sent."""

    def __init__(self, texts: TokenTexts) -> None:
        self._texts = texts
        self._held: deque[tuple[int, TokenLogprobs]] = deque()  # (where its text starts, its logprobs)
        self._unplaced: list[TokenLogprobs] = []  # tokens whose text is not complete yet
        self._detokenized = 0  # characters of text the tokens so far make
        self._sent = 0  # characters of it sent

    def add(self, pieces: Sequence[str], logprobs: Sequence[TokenLogprobs]) -> None:
        """New tokens: the text each one completes (IncrementalDetokenizer.pieces) and their logprobs."""
        for piece, entry in zip(pieces, logprobs):
            self._unplaced.append(entry)
            if piece:
                self._place(piece)

    def _place(self, piece: str) -> None:
        """The tokens since the last piece made `piece` together: each starts at the character its first byte
        is in, where their bytes add up to the piece's (byte-level vocabularies); else all where it starts."""
        utf8 = piece.encode()
        sizes = [len(self._texts.utf8(entry.token_id)) for entry in self._unplaced]
        exact = sum(sizes) == len(utf8)
        for entry, start in zip(self._unplaced, itertools.accumulate([0, *sizes[:-1]])):
            offset = len(utf8[:start].decode(errors="ignore")) if exact else 0
            self._held.append((self._detokenized + offset, entry))
        self._unplaced.clear()
        self._detokenized += len(piece)

    def sent(self, text: str, finished: bool = False, stopped: bool = False) -> list[SentLogprobs]:
        """`text` is going out: the logprobs of the tokens whose text starts in what is sent by now. With
        finished, all the others too, unless a stop string cut them off (stopped)."""
        self._sent += len(text)
        released = []
        while self._held and (self._held[0][0] < self._sent or finished and not stopped):
            offset, entry = self._held.popleft()
            released.append(self._with_text(entry, offset))
        if finished and not stopped:  # tokens without text at the end (EOS) start where the text ends
            released += [self._with_text(entry, self._detokenized) for entry in self._unplaced]
        if stopped or finished:
            self._held.clear()
            self._unplaced.clear()
        return released

    def _with_text(self, entry: TokenLogprobs, offset: int) -> SentLogprobs:
        top = tuple(self._candidate(token_id, logprob) for token_id, logprob in entry.top)
        return SentLogprobs(self._candidate(entry.token_id, entry.logprob), top, offset)

    def _candidate(self, token_id: int, logprob: float) -> TokenCandidate:
        return TokenCandidate(token_id, logprob, self._texts.text(token_id), self._texts.utf8(token_id))
