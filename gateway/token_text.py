"""The text of a single token, for logprobs: its exact UTF-8 bytes, and a string to show.

One token may hold part of a character (byte-level BPE splits an emoji over several tokens), so decoding it
alone gives U+FFFD. OpenAI's chat logprobs carry the exact `bytes` for that reason; they are read here from
the vocabulary: byte-level BPE (GPT-2, Llama 3, SmolLM) through its byte alphabet, SentencePiece through
its `<0xNN>` byte tokens and the `▁` that stands for a space. Added tokens (`<|im_end|>`) are their content.
"""
from __future__ import annotations

import functools
import re

import tokenizers

from gateway.tokenizer import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()


class TokenTexts:
    """Bytes and display text of the served model's tokens (cached: each token is worked out once)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._backend = tokenizer.backend
        self._byte_level = isinstance(self._backend.decoder, tokenizers.decoders.ByteLevel)
        self._added = {token_id: token.content for token_id, token in tokenizer.hf.added_tokens_decoder.items()}

    @functools.lru_cache(maxsize=65536)
    def utf8(self, token_id: int) -> bytes:
        """The token's bytes as they appear in the generated text (part of a character, for some)."""
        if token_id in self._added:
            return self._added[token_id].encode()
        token = self._backend.id_to_token(token_id) or ""
        if self._byte_level and all(c in _BYTE_LEVEL for c in token):
            return bytes(_BYTE_LEVEL[c] for c in token)
        byte = _BYTE_TOKEN.fullmatch(token)
        if byte is not None:
            return bytes([int(byte[1], 16)])
        return token.replace("▁", " ").encode()

    def text(self, token_id: int) -> str:
        """The token as a string: its bytes decoded, a part of a character as U+FFFD."""
        return self.utf8(token_id).decode("utf-8", errors="replace")
