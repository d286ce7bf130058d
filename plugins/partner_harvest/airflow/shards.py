"""Split the partners' DAGs over N thin DAG files, so that no file's parse nears Airflow's timeouts.

    partner-harvest shards --shards 16 dags/

writes ``partner_harvest_shard_00.py`` ... ``partner_reconcile_shard_15.py``, each building
the partners whose stable hash of the id falls in its share (dag_factory.shard_of), and
lists ``partner_harvest.py`` / ``partner_reconcile.py`` in the folder's ``.airflowignore``
(they would build every partner again). ``--shards 1`` undoes it. Every file is rewritten,
so the dag-processor parses them all at once (modified_time order): a DAG never sits in two
files for longer than one pass. docs/operator/many-partners.md says how many to choose.

    partner-harvest shards --touch dags/

after an edit of the registry: with a long ``min_file_process_interval`` the dag-processor
parses a file again only when its mtime is newer than its last parse, and the registry is
not a DAG file; this sets the partner DAG files' mtime to now.
"""

from __future__ import annotations

import re
from pathlib import Path

KINDS = ("harvest", "reconcile")
SHARD_FILE = re.compile(r"^partner_(harvest|reconcile)_shard_\d+\.py$")
IGNORE_MARK = "# partner harvest shards (python -m partner_harvest.airflow.shards)"
UNSHARDED = ("partner_harvest.py", "partner_reconcile.py")

TEMPLATE = '''"""Shard {index} of {count} of the {kind} DAGs (written by partner-harvest shards).

The partners whose stable id hash falls in this share; docs/operator/many-partners.md.
"""

from airflow.sdk import get_parsing_context

from partner_harvest.airflow.dag_factory import build_dags

build_dags("{kind}", get_parsing_context().dag_id, shard=({index}, {count}))
'''


def write_shards(dags_folder: Path, count: int) -> list[Path]:
    """The shard files for ``count`` shards (none for 1), old ones of another count removed."""
    if count < 1 or count > 1000:
        raise ValueError(f"--shards must be 1..1000, not {count}")
    for old in dags_folder.iterdir():
        if SHARD_FILE.match(old.name):
            old.unlink()
    written: list[Path] = []
    if count > 1:
        for kind in KINDS:
            for index in range(count):
                path = dags_folder / f"partner_{kind}_shard_{index:02d}.py"
                path.write_text(TEMPLATE.format(kind=kind, index=index, count=count), encoding="utf-8")
                written.append(path)
    _ignore_unsharded(dags_folder / ".airflowignore", count > 1)
    return written


def _ignore_unsharded(ignore: Path, on: bool) -> None:
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.exists() else []
    kept = [line for line in lines if line != IGNORE_MARK and line not in UNSHARDED]
    if on:
        kept += [IGNORE_MARK, *UNSHARDED]
    if kept:
        ignore.write_text("\n".join(kept) + "\n", encoding="utf-8")
    elif ignore.exists():
        ignore.unlink()


def touch_dag_files(dags_folder: Path) -> list[Path]:
    """Mark every partner DAG file changed now, so the dag-processor parses it at its next loop."""
    touched = []
    for path in sorted(dags_folder.iterdir()):
        if SHARD_FILE.match(path.name) or path.name in (*UNSHARDED, "partner_registry_check.py"):
            path.touch()
            touched.append(path)
    return touched
