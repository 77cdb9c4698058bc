"""Incremental detokenization: token ids arrive a few at a time, text leaves only as whole characters.

Byte-level BPE splits one character over several tokens (an emoji is often 3), so decoding tokens one
by one would emit U+FFFD halves. `tokenizers.decoders.DecodeStream` keeps vLLM's prefix / read offsets
in Rust: it decodes a small window of recent tokens, returns only the text that the newest token
added, and holds text back (returns None) while it still ends in an incomplete character. The work per
token is bounded by that window, not by the length of the output.
"""
from __future__ import annotations

from collections.abc import Iterable

import tokenizers
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text deltas; special tokens are skipped."""

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)

    def add(self, token_ids: Iterable[int]) -> str:
        """The new text that `token_ids` complete (may be "" while a character is still partial)."""
        return "".join(self.pieces(token_ids))

    def pieces(self, token_ids: Iterable[int]) -> list[str]:
        """The new text each token completes, one piece per token ("" for a token that ends in a partial
        character, or a special token): where each token's text starts, for logprobs."""
        return [self._stream.step(self._tokenizer, token_id) or "" for token_id in token_ids]
