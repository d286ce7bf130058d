"""Docs that repeat what the code declares, checked against the code so they cannot drift: the
run's tasks (README's diagram and steps, operating.md's table of DAGs) against the DAGs the
factory builds, and the partner Connection types (connections.md, deploy.md) against the hooks.

The README once drew the run without `approval_gate` and `check_quality`, and deploy.md said
partner Connections are of type `http`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from airflow.sdk import DAG

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = """partners:
  - {id: museum, protocol: oai-pmh, conn_id: c}
  - {id: library, protocol: sierra, conn_id: d}
  - {id: big, protocol: oai-pmh, conn_id: e, slicing: {reconcile_slices: 4}}
"""


def _doc(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start:following if following != -1 else None]


@pytest.fixture
def dags(registry: Callable[[str], Path]) -> dict[str, DAG]:
    from partner_harvest.airflow.dag_factory import build_dags

    registry(REGISTRY)
    return {dag.dag_id: dag for kind in ("harvest", "reconcile") for dag in build_dags(kind)}


def test_the_readme_draws_and_lists_every_task_of_a_harvest_run(dags: dict[str, DAG]) -> None:
    run = _section(_doc("README.md"), "## A run")
    diagram = run[run.index("```"):run.index("```", run.index("```") + 3)]
    steps = run[run.index("```", run.index("```") + 3):]
    for dag_id in ("harvest_museum", "harvest_library"):
        for task_id in dags[dag_id].task_ids:
            assert task_id in diagram, f"README's run diagram lacks {task_id} ({dag_id})"
            assert f"**{task_id}**" in steps, f"README's steps of a run lack **{task_id}** ({dag_id})"


def test_operating_lists_the_tasks_of_each_dag_of_a_partner(dags: dict[str, DAG]) -> None:
    table = _section(_doc("docs/operator/operating.md"), "## The DAGs of a partner")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(harvest|reconcile)_<id>` \|[^|]*\|(.*)\|$", table, re.M)}
    for dag_id, dag in dags.items():
        kind = dag_id.split("_", 1)[0]
        for task_id in dag.task_ids:
            assert f"`{task_id}`" in rows[kind], f"operating.md's row of {kind}_<id> lacks `{task_id}` ({dag_id})"


def test_the_connection_types_in_the_docs_are_the_hooks_of_each_protocol() -> None:
    """Each protocol's row in connections.md names the connection type and hook class its
    partners are read with; deploy.md names the same types."""
    from partner_harvest import protocols
    from partner_harvest.airflow.hooks import hook_for

    connections, deploy = _doc("docs/operator/connections.md"), _doc("docs/operator/deploy.md")
    names = [spec.name for spec in protocols.specs()]
    assert len(names) >= 3, names  # oai-pmh, sierra, iiif-change-discovery at least: never an empty loop
    for protocol in names:
        hook = hook_for(protocol, "any")
        klass = f"`{type(hook).__module__}.{type(hook).__name__}`"
        row = next((line for line in connections.splitlines() if f"`protocol: {protocol}`" in line), None)
        assert row is not None, f"connections.md has no row for protocol {protocol}"
        assert row.startswith(f"| `{hook.conn_type}` ") and row.rstrip().endswith(f"| {klass} |"), (protocol, row)
        assert f"`{hook.conn_type}`" in deploy, f"deploy.md does not name the connection type {hook.conn_type}"
