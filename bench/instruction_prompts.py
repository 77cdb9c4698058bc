"""Chat prompts of ordinary instruction traffic, built from the Python standard library's own sources.

Every machine with Python has the text (the GPU machine included, where nothing else can be fetched), and none
of it is in this repository. The asks mix those whose answer copies much of the prompt (rewrite, add type hints,
rename) with those whose answer does not (explain, summarize, test, review), as a chat service sees them.
"""
from __future__ import annotations

import importlib
import inspect

ASKS = (
    "Explain what this Python function does, step by step:\n\n{code}",
    "Add type hints to this function and return the whole function:\n\n{code}",
    "Write two pytest unit tests for this function:\n\n{code}",
    "Summarize this documentation in three sentences:\n\n{doc}",
    "Rename the local variables of this function to clearer names and return the whole function:\n\n{code}",
    "What could go wrong when calling this function? List the cases.\n\n{code}",
    "Rewrite this docstring in plain English for a beginner:\n\n{doc}",
    "Review this code and suggest improvements:\n\n{code}",
)
MODULES = ("textwrap", "shlex", "fnmatch", "posixpath", "glob", "base64", "html", "colorsys", "calendar",
           "difflib", "copy", "configparser", "csv", "ipaddress", "email.utils", "urllib.parse", "string",
           "heapq", "bisect", "statistics", "json.encoder", "json.decoder", "tokenize", "pprint")


def _functions(max_chars: int) -> list[tuple[str, str]]:
    """(source, docstring) of the modules' pure-Python functions that have a docstring, in a fixed order."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for _, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__ or not function.__doc__ or len(function.__doc__) < 80:
                continue
            try:
                source = inspect.getsource(function)
            except OSError:  # no source file (frozen or generated)
                continue
            if len(source) <= max_chars:
                found.append((source.strip("\n"), inspect.cleandoc(function.__doc__)))
    return found


def instruction_prompts(count: int, max_chars: int = 1500) -> list[str]:
    """`count` distinct user messages (each function once per ask, asks taken in turn)."""
    functions = _functions(max_chars)
    prompts = []
    for index in range(count):
        ask = ASKS[index % len(ASKS)]
        code, doc = functions[(index // len(ASKS) + 13 * (index % len(ASKS))) % len(functions)]
        prompts.append(ask.format(code=code, doc=doc))
    if len(set(prompts)) < count:
        raise ValueError(f"count: only {len(set(prompts))} distinct prompts from {len(functions)} functions")
    return prompts
