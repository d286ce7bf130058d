"""Regenerate the docs' reference pages (scripts/docs_gen.py) from the code and schema.

    .venv/bin/python scripts/gen_docs.py            # rewrite the stale pages, name them
    .venv/bin/python scripts/gen_docs.py --check    # only name them; exit 1 if any is stale

The tables page is read from a database the migrations just ran on: a fresh one in the
embedded PostgreSQL (or in the server HARVEST_DATABASE_URL names, which then needs CREATEDB),
dropped afterwards.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

from include import embedded_pg  # noqa: E402
from partner_harvest.store import connect, ensure_schema  # noqa: E402
from scripts import docs_gen  # noqa: E402


def migrated_comments() -> dict:
    server = embedded_pg.start("docs")
    name = f"docs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        params = conninfo_to_dict(server)
        params["dbname"] = name
        with connect(make_conninfo("", **params)) as conn:
            ensure_schema(conn)
            return docs_gen.table_comments(conn)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only name the stale pages (exit 1 if any)")
    args = parser.parse_args(argv)
    comments = migrated_comments()
    if args.check:
        stale = docs_gen.stale_pages(comments)
        for page in stale:
            print(f"stale: {page.relative_to(ROOT)}")
        return 1 if stale else 0
    for page in docs_gen.write_pages(comments):
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
