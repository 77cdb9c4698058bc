"""OpenAI parameters that specd does not implement: refused naming them, never silently ignored.

A client may still send one at the value that asks for nothing (`"echo": false`,
`"suffix": ""`, `"tools": []`): SDKs and frameworks often do, and the answer is the same.
"""
from __future__ import annotations

from typing import Any

from gateway.validation import RequestError

# parameter -> the values that ask for nothing (None, i.e. JSON null, always does)
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "suffix": ("",),
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (),
}


def without_unsupported(body: dict[str, Any]) -> dict[str, Any]:
    """`body` without the unimplemented parameters that ask for nothing; RequestError naming the first
    parameter (or chat content part) that asks for something not built."""
    _check(body)
    return {name: value for name, value in body.items() if name not in NEUTRAL_VALUES}


def _check(body: dict[str, Any]) -> None:
    for name, neutral in NEUTRAL_VALUES.items():
        value = body.get(name)
        if value is not None and not any(_same(value, n) for n in neutral):
            raise RequestError(name, f"is not supported by this server (got {_short(value)}); "
                                     "leave it out or send null")
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise RequestError(f"messages[{i}].content[{j}].type",
                                   f"{_short(kind)} parts are not supported; only text parts are")


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality: 0 equals 0.0, but false is no 0."""
    return type(value) is type(neutral) and value == neutral or (
        isinstance(value, (int, float)) and not isinstance(value, bool)
        and isinstance(neutral, (int, float)) and not isinstance(neutral, bool) and value == neutral)


def _short(value: Any) -> str:
    if isinstance(value, (list, dict)):  # never repr'd: a deeply nested one would not come back
        return "a list" if isinstance(value, list) else "an object"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
