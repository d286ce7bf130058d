"""The generated reference pages are current: the registry's JSON Schema (from its models),
registry (from the JSON Schema), command line (from its parser), HTTP limits (from the
policy's defaults), partner states and validation checks (from their tables). Regenerate
with `.venv/bin/python scripts/gen_docs.py`. The tables page needs a database:
tests/integration/test_docs_tables.py."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from partner_harvest.cli import build_parser
from scripts import docs_gen

PAGES = [docs_gen.SCHEMA, docs_gen.REGISTRY_PAGE, docs_gen.CLI_PAGE, docs_gen.LIMITS_PAGE, docs_gen.STATES_PAGE,
         docs_gen.METRICS_PAGE, docs_gen.VALIDATION_PAGE, docs_gen.ALERTS_PAGE]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_generated_page_is_current(page: Path) -> None:
    render = docs_gen.pages(None)[page]
    text = page.read_text(encoding="utf-8")
    assert render(text) == text, f"{page.relative_to(docs_gen.ROOT)} is stale: run scripts/gen_docs.py"


def test_the_registry_reference_lists_every_key_of_the_schema() -> None:
    schema = json.loads(docs_gen.SCHEMA.read_text(encoding="utf-8"))
    page = docs_gen.REGISTRY_PAGE.read_text(encoding="utf-8")
    for name, model in schema["$defs"].items():
        for key in model.get("properties", {}):
            assert f"| `{key}` |" in page, f"{name}.{key} missing from the registry reference"


def test_the_cli_reference_has_every_command_and_option() -> None:
    page = docs_gen.CLI_PAGE.read_text(encoding="utf-8")
    for name, _, sub in docs_gen._subcommands(build_parser()):
        assert f"## {name}\n" in page
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page


def test_cli_md_has_a_row_for_every_command_and_none_for_a_command_that_is_gone() -> None:
    """docs/operator/cli.md's command table is written by hand (what each command does, what it
    needs); this keeps its rows and the parser's commands one set."""
    import re

    page = (docs_gen.ROOT / "docs" / "operator" / "cli.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z][a-z-]*)[ `]", page, flags=re.MULTILINE))
    commands = {name for name, _, _ in docs_gen._subcommands(build_parser())}
    assert rows == commands, f"cli.md's table lacks {sorted(commands - rows)}, lists gone {sorted(rows - commands)}"


def test_the_limits_table_follows_the_policy_defaults() -> None:
    class Policy(pydantic.BaseModel):
        read_timeout: float = 7.0
        brand_new_cap: int = 3 * 1024 * 1024

    table = docs_gen.limits_table(Policy)
    assert "| `read_timeout` | seconds of silence between two bytes | `7` |" in table
    assert "| `brand_new_cap` |  | `3145728 (3 MiB)` |" in table


def test_a_page_without_its_block_is_refused() -> None:
    with pytest.raises(ValueError, match="http-limits"):
        docs_gen.replace_block("no markers here", "http-limits", "x")
    assert docs_gen.replace_block("a\n<!-- b:begin -->\nold\n<!-- b:end -->\nz", "b", "new") == (
        "a\n<!-- b:begin -->\nnew\n<!-- b:end -->\nz")


def test_the_metrics_page_names_every_metric_the_code_defines() -> None:
    from partner_harvest import metrics

    page = docs_gen.METRICS_PAGE.read_text(encoding="utf-8")
    for m in metrics.METRICS:
        assert f"| `partner_harvest.{m.key}.<partner_id>` | {m.kind} |" in page
