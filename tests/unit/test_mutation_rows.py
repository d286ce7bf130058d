"""The mutation check's rows still name code that exists (tests/mutation_check.py).

A row whose text to break moved on reports STALE only when someone replays it; this keeps
every row pointing at exactly one place on every run of the suite, and pins how an indented
text is matched (at the start of a line only: as a plain substring it also matched a more
deeply indented line, and the broken file did not even compile).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "mutation_check.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_check", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


mutation_check = _module()


def test_an_indented_text_counts_only_from_the_start_of_a_line() -> None:
    text = "def f():\n    if x:\n        y = 1\n    y = 1\n"
    assert mutation_check._occurrences(text, "    y = 1\n") == 1
    assert mutation_check._replaced(text, "    y = 1\n", "    y = 2\n") == "def f():\n    if x:\n        y = 1\n    y = 2\n"
    assert mutation_check._occurrences(text, "y = 1") == 2  # an unindented text is a substring


@pytest.mark.parametrize("row", mutation_check.MUTATIONS, ids=lambda row: row.id)
def test_every_mutation_row_finds_its_text_exactly_once(row: Any) -> None:  # a mutation_check.Mutation
    source = (mutation_check.ROOT / mutation_check.LIB / row.file).read_text(encoding="utf-8")
    for find, _ in row.edits:
        assert mutation_check._occurrences(source, find) == 1, f"{row.id}: update the row and tests/INVARIANTS.md"
