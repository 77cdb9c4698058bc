"""The served model's tokenizer: prompts and chat messages to token ids, and its end-of-sequence ids."""
from __future__ import annotations

from pathlib import Path

import tokenizers
from transformers import AutoTokenizer, GenerationConfig


class Tokenizer:
    """Wraps the Hugging Face tokenizer of one checkpoint folder (a fast tokenizer is required)."""

    def __init__(self, model_path: str | Path) -> None:
        self.model_path = Path(model_path)
        self.hf = AutoTokenizer.from_pretrained(self.model_path)
        if not self.hf.is_fast:
            raise ValueError(f"model: {self.model_path} has no fast tokenizer (tokenizer.json)")
        self.vocab_size = len(self.hf)
        self.eos_token_ids = _eos_token_ids(self.model_path, self.hf)
        # No token covers more characters than its longest vocabulary entry, so a text longer than
        # max_token_chars * n characters has more than n tokens: checked before tokenizing, this keeps
        # a megabyte prompt from stalling the event loop just to be rejected.
        self.max_token_chars = max(len(token) for token in self.hf.get_vocab())

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The Rust tokenizer, used for cheap incremental decoding."""
        return self.hf.backend_tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain prompt, with the special tokens the tokenizer adds (e.g. BOS)."""
        return self.hf.encode(text)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation rendered by the model's chat template, ready for the reply."""
        if self.hf.chat_template is None:
            raise ValueError("messages: the model has no chat template; use /v1/completions")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The template already writes the special tokens (BOS, role markers); do not add them twice.
        return self.hf.encode(text, add_special_tokens=False)

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
