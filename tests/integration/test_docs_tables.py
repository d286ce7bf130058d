"""docs/tables.md is what a migrated PostgreSQL says about its own tables (COMMENT ON, from
migration 0018_comments.sql), and every column a consumer or an operator reads has a
meaning. Regenerate with `.venv/bin/python scripts/gen_docs.py`."""

from __future__ import annotations

import psycopg

from scripts import docs_gen


def test_the_tables_page_is_what_the_migrated_database_says(conn: psycopg.Connection) -> None:
    comments = docs_gen.table_comments(conn)
    page = docs_gen.TABLES_PAGE.read_text(encoding="utf-8")
    assert docs_gen.tables_reference(comments) + "\n" == page, "docs/tables.md is stale: run scripts/gen_docs.py"


def test_every_table_and_every_column_readers_use_has_a_comment(conn: psycopg.Connection) -> None:
    comments = docs_gen.table_comments(conn)
    missing = [name for name, (_, comment, _) in comments.items() if not comment and not name.endswith("_id_seq")]
    assert not missing, f"relations without COMMENT ON: {missing}"
    for name in (*docs_gen.CONTRACT, *docs_gen.OPERATIONS):
        _, _, columns = comments[name]
        if name == "quarantine_current":
            continue  # a view of quarantine: its columns are quarantine's
        bare = [column for column, *_, text in columns if not text]
        assert not bare, f"{name} has columns without COMMENT ON: {bare}"
