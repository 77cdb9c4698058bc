"""Every SPECD_* variable is read in specd/environment.py alone, and docs/PUBLIC_SURFACE.md's table lists exactly
the ones it reads."""
from __future__ import annotations

import ast
import re

from architecture.imports_graph import REPO, module_files
from specd import environment

TABLE_ROW = re.compile(r"^\| `((?:SPECD_|[A-Z]+_)[A-Z_]*)` \|", re.MULTILINE)


def _section() -> str:
    text = (REPO / "docs" / "PUBLIC_SURFACE.md").read_text()
    section = text[text.index("## Environment"):]
    return section[:section.index("\n## ", 1)]


def _documented() -> set[str]:
    return set(TABLE_ROW.findall(_section()))


def _variables_of_the_module() -> set[str]:
    return {value for name, value in vars(environment).items()
            if name.isupper() and isinstance(value, str) and value.startswith("SPECD_") and value != "SPECD_"}


def test_every_variable_the_module_reads_is_in_the_table():
    assert _variables_of_the_module() - _documented() == set()


def test_every_specd_variable_in_the_table_is_read_by_the_module():
    documented = {name for name in _documented() if name.startswith("SPECD_")}
    assert documented - _variables_of_the_module() == set()


def test_cli_options_are_read_through_their_documented_rule():
    assert environment.option_name("max-model-len") == "SPECD_MAX_MODEL_LEN"
    assert "| `SPECD_<OPTION>` |" in _section()


def test_no_other_module_names_a_specd_variable():
    """Code reads SPECD_* through specd.environment's accessors and names; no other file spells one."""
    spelled = sorted(f"{module}: {node.value}" for module, path in module_files().items()
                     if module != "specd.environment"
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and re.fullmatch(r"SPECD_[A-Z_]+", node.value))
    assert spelled == []
