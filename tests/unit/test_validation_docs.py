"""docs/operator/validation.md holds the table of checks generated from formats/checks.py."""

from __future__ import annotations

import json
from pathlib import Path

from partner_harvest.formats.checks import CHECKS, with_table

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "operator" / "validation.md"


def test_the_operator_page_lists_every_check_as_the_code_defines_it() -> None:
    """Regenerate with: .venv/bin/python scripts/gen_docs.py"""
    text = DOC.read_text(encoding="utf-8")
    assert with_table(text) == text, "docs/operator/validation.md is stale: regenerate its table"
    assert all(f"`{name}`" in text for name in CHECKS)


def test_the_registry_schema_knows_the_overridable_checks() -> None:
    schema = json.loads((ROOT / "include" / "partners.schema.json").read_text(encoding="utf-8"))
    names = schema["$defs"]["Options"]["properties"]["validation"]["propertyNames"]["enum"]
    assert names == sorted(name for name, check in CHECKS.items() if check.overridable)
