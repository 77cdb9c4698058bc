"""The served model's tokenizer: prompts and chat messages to token ids, and its end-of-sequence ids.

Client text is never parsed into special tokens: `<|im_end|>` typed into a message is the text
"<|im_end|>", not a role marker. Only the chat template's own markers become special tokens
(gateway/chat_segments.py splits a rendered conversation into the two).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import tokenizers
import transformers
from transformers import GenerationConfig

from gateway.chat_segments import render_segments


def encode_serially() -> None:
    """Has the Rust tokenizer encode a batch's texts one after another on the calling thread (a gateway process's
    setting, made before its first encode; a value the operator set wins).

    A chat prompt is encoded as a batch of its text segments (about five), which the library otherwise spreads over a
    thread pool as large as the machine, whose wake-ups cost more than they save: on the 2-core machine a chat
    request of about 660 characters took 656-706 us of CPU against 472-531, and a gateway process
    (tools/gateway_cpu.py, 64 clients, 16-token requests, in turns) 81-88 us of CPU a token against 74-80.
    encode_batch_fast still releases the GIL."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class Tokenizer:
    """Wraps the Hugging Face tokenizer of one checkpoint folder (a fast tokenizer is required)."""

    def __init__(self, model_path: str | Path) -> None:
        self.model_path = Path(model_path)
        self.hf = _tokenizer_class(self.model_path).from_pretrained(self.model_path)
        if not self.hf.is_fast:
            raise ValueError(f"model: {self.model_path} has no fast tokenizer (tokenizer.json)")
        self.vocab_size = len(self.hf)
        self.eos_token_ids = _eos_token_ids(self.model_path, self.hf)
        # A copy of the Rust tokenizer that reads special-token text as plain text. Its encode_batch_fast
        # releases the GIL (encode does not), so tokenizing on a worker thread leaves the event loop free; it
        # leaves out the character offsets, which nothing here reads (the same ids, a fifth less CPU).
        self._text_encoder = tokenizers.Tokenizer.from_str(self.backend.to_str())
        self._text_encoder.encode_special_tokens = True
        self.special_tokens = {token.content: token_id for token_id, token in self.hf.added_tokens_decoder.items()
                               if token.special}
        # No token covers more characters (or UTF-8 bytes) than its longest vocabulary entry, so a text
        # longer than that times n has more than n tokens: checked before tokenizing, this keeps a
        # megabyte prompt from costing a tokenizer run just to be rejected.
        self.max_token_chars = max(len(token) for token in self.hf.get_vocab())
        self.max_token_bytes = max(len(self.backend.decode([i], skip_special_tokens=False).encode())
                                   for i in range(self.vocab_size))

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The Rust tokenizer, used for cheap incremental decoding."""
        return self.hf.backend_tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain prompt, with the special tokens the tokenizer adds (e.g. BOS); special-token
        text in `text` stays text."""
        return self._text_encoder.encode_batch_fast([text], add_special_tokens=True)[0].ids

    @property
    def has_chat_template(self) -> bool:
        return self.hf.chat_template is not None

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation rendered by the model's chat template, ready for the reply.

        The template writes the special tokens (BOS, role markers); they are not added twice, and
        special-token text inside the messages stays text."""
        if not self.has_chat_template:
            raise ValueError("the model has no chat template; use /v1/completions")
        segments = render_segments(self._render, messages, self.special_tokens)
        texts = iter(self._text_encoder.encode_batch_fast([s for s in segments if isinstance(s, str)],
                                                         add_special_tokens=False))
        ids: list[int] = []
        for segment in segments:
            ids += [segment] if isinstance(segment, int) else next(texts).ids
        return ids

    def _render(self, messages: list[dict]) -> str:
        return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def decode(self, token_ids: list[int]) -> str:
        """Text of whole token ids, special tokens skipped (as the streaming detokenizer does)."""
        return self.hf.decode(token_ids, skip_special_tokens=True)


def _eos_token_ids(model_path: Path, hf) -> tuple[int, ...]:
    """The ids that end generation: generation_config.json's eos_token_id (int or list), else the tokenizer's."""
    ids: set[int] = set()
    if (model_path / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if hf.eos_token_id is not None:
        ids.add(hf.eos_token_id)
    return tuple(sorted(ids))


def _tokenizer_class(model_path: Path):
    """The tokenizer class the checkpoint names (tokenizer_config.json's tokenizer_class), as AutoTokenizer would
    pick it, without AutoTokenizer's import of the model configurations, which imports torch: the gateway never
    needs torch (without it a gateway process's imports and tokenizer take 2.4 s instead of about 7, and it holds
    150 MB instead of 388: docs/BENCHMARKS.md round 34). A checkpoint that names no class, or one transformers does
    not have, goes through AutoTokenizer."""
    config = model_path / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    found = getattr(transformers, name, None) if isinstance(name, str) else None
    if isinstance(found, type) and hasattr(found, "from_pretrained"):
        return found
    from transformers import AutoTokenizer
    return AutoTokenizer
