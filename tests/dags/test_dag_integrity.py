"""The DAG files parse, and every registry partner gets a well-formed harvest DAG."""

from __future__ import annotations

from pathlib import Path

import pytest

from partner_harvest.registry import load_partners


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}


@pytest.mark.parametrize("partner", load_partners(), ids=lambda p: p.id)
def test_reconcile_dag_shape(dagbag, partner) -> None:
    dag = dagbag.get_dag(f"reconcile_{partner.id}")
    assert dag.task_ids == ["reconcile"] and dag.max_active_runs == 1
    assert dag.get_task("reconcile").pool == f"partner_{partner.id}"
    assert dag.params.get_param("allow_mass_purge").value is False


@pytest.mark.parametrize("partner", load_partners(), ids=lambda p: p.id)
def test_harvest_dag_shape(dagbag, partner) -> None:
    dag = dagbag.get_dag(f"harvest_{partner.id}")
    assert dag is not None
    assert {"freeze_window", "harvest_changes", "apply_changes", "advance_cursor"} <= set(dag.task_ids)
    assert dag.get_task("advance_cursor").upstream_task_ids >= {"apply_changes", "freeze_window"}
    channels = {"harvest_changes", "poll_deletions"} if partner.protocol == "sierra" else {"harvest_changes"}
    assert dag.get_task("apply_changes").upstream_task_ids == channels | {"freeze_window"}  # the frozen window, to harvest again a channel whose staging was lost
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert {t.task_id for t in dag.tasks if t.pool == partner.pool} >= {"freeze_window", "harvest_changes"}
    assert dag.get_task("apply_changes").pool == "default_pool"  # only requests to the partner are pooled
    assert dag.get_task("check_quality").upstream_task_ids == {"apply_changes"}
    assert set(dag.params.get_param("mode").schema["enum"]) == {"incremental", "full", "window"}


def test_bad_registry_fails_parsing_naming_file_partner_field(tmp_path: Path, monkeypatch, airflow_db) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bad = tmp_path / "partners.yaml"
    bad.write_text("partners:\n  - {id: broken, protocol: oai-pmh, conn_id: c, lag: whenever}\n")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(bad))
    root = Path(__file__).resolve().parents[2]
    errors = DagBag(dag_folder=str(root / "dags")).import_errors
    assert {Path(path).name for path in errors} == {"partner_harvest.py", "partner_reconcile.py"}
    for message in errors.values():
        assert str(bad) in message and "partner 'broken'" in message and "field 'lag'" in message


def test_airflow_plugin_loader_leaves_the_library_alone() -> None:
    """Without plugins/.airflowignore, Airflow imports every plugins/*.py as a top-level
    module: partner_harvest/http.py would shadow the standard library's http."""
    import sys

    from airflow._shared.plugins_manager.plugins_manager import _load_plugins_from_plugin_directory

    root = Path(__file__).resolve().parents[2]
    plugins, errors = _load_plugins_from_plugin_directory(str(root / "plugins"))
    assert errors == {}
    import http

    assert "partner_harvest" not in (http.__file__ or "")
    assert not {"records", "registry", "window", "errors"} & set(sys.modules)


def test_pools_are_synced_from_the_registry(tmp_path: Path, monkeypatch, airflow_db) -> None:
    from airflow.models.pool import Pool

    from partner_harvest.airflow.pools import sync_pools

    registry = tmp_path / "partners.yaml"
    registry.write_text("partners:\n  - {id: pooled, protocol: oai-pmh, conn_id: c, pool_slots: 2}\n")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(registry))
    assert sync_pools() == [("partner_pooled", 2, "Concurrent requests to partner pooled (oai-pmh, Connection c)")]
    sync_pools()  # idempotent
    assert Pool.get_pool("partner_pooled").slots == 2
