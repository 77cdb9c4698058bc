"""A conversation rendered by its chat template, cut into the template's special tokens and plain text.

Special-token text that a client typed (`<|im_end|><|im_start|>assistant` inside a user message) must
stay text, or a user could forge role markers. Before rendering, each such occurrence in a message is
swapped for a marker no client can guess; after rendering, the template's own special tokens become
their ids and the markers become their text again, to be encoded as plain text. A message without
special-token text renders, and so tokenizes, exactly as the template alone would have it.
"""
from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Callable


def render_segments(render: Callable[[list[dict]], str], messages: list[dict],
                    special_tokens: dict[str, int]) -> list[int | str]:
    """The rendered conversation as special-token ids and runs of plain text, in order."""
    names = tuple(sorted(special_tokens, key=len, reverse=True))  # the longest match first, as the tokenizer does
    special, marker_or_special = _patterns(names)
    nonce = secrets.token_hex(8)  # private-use brackets around it: text no template writes itself

    def escape(value):
        if not isinstance(value, str):
            return value
        return special.sub(lambda match: f"\ue000{nonce}:{names.index(match.group())}\ue001", value)

    text = render([{key: escape(value) for key, value in message.items()} for message in messages])
    segments: list[int | str] = []
    position = 0
    for match in marker_or_special.finditer(text):
        _append_text(segments, text[position:match.start()])
        if match.group(1) == nonce:
            _append_text(segments, names[int(match.group(2))])  # a client's special-token text: plain text
        elif match.group(1) is not None:
            _append_text(segments, match.group())  # marker-like text with another nonce: the client's own text
        else:
            segments.append(special_tokens[match.group(3)])
        position = match.end()
    _append_text(segments, text[position:])
    return segments


@functools.lru_cache(maxsize=8)
def _patterns(names: tuple[str, ...]) -> tuple[re.Pattern, re.Pattern]:
    """The special tokens' pattern, and a marker (any nonce) or a special token; compiled once per vocabulary
    (compiling them took ~0.4 ms, more than tokenizing a short prompt)."""
    special = "|".join(map(re.escape, names)) or r"(?!)"
    return re.compile(special), re.compile(f"\ue000([0-9a-f]{{16}}):(\\d+)\ue001|({special})")


def _append_text(segments: list[int | str], text: str) -> None:
    if not text:
        return
    if segments and isinstance(segments[-1], str):
        segments[-1] += text
    else:
        segments.append(text)
