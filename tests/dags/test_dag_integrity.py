"""The DAG files parse, and every registry partner gets a well-formed harvest DAG."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from partner_harvest.registry import load_partners
from tests.support.checks import present

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag

    from partner_harvest.registry import Partner

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_errors(dagbag: DagBag) -> None:
    assert dagbag.import_errors == {}


@pytest.mark.parametrize("partner", load_partners(), ids=lambda p: p.id)
def test_reconcile_dag_shape(dagbag: DagBag, partner: Partner) -> None:
    dag = dagbag.get_dag(f"reconcile_{partner.id}")
    assert sorted(dag.task_ids) == ["apply_reconcile", "approval_gate", "reconcile"] and dag.max_active_runs == 1
    assert dag.get_task("reconcile").pool == f"partner_{partner.id}"
    # the approval gate (docs/operator/approvals.md) between the staged reconcile and its apply
    assert dag.get_task("approval_gate").upstream_task_ids == {"reconcile"}
    assert dag.get_task("apply_reconcile").upstream_task_ids == {"reconcile", "approval_gate"}
    assert dag.params.get_param("allow_mass_purge").value is False


@pytest.mark.parametrize("partner", load_partners(), ids=lambda p: p.id)
def test_harvest_dag_shape(dagbag: DagBag, partner: Partner) -> None:
    dag = dagbag.get_dag(f"harvest_{partner.id}")
    assert dag is not None
    assert {"freeze_window", "harvest_changes", "apply_changes", "advance_cursor"} <= set(dag.task_ids)
    assert dag.get_task("advance_cursor").upstream_task_ids >= {"apply_changes", "freeze_window"}
    channels = {"harvest_changes", "poll_deletions"} if partner.protocol == "sierra" else {"harvest_changes"}
    # the frozen window (to harvest again a channel whose staging was lost), and the approval gate
    assert dag.get_task("apply_changes").upstream_task_ids == channels | {"freeze_window", "approval_gate"}
    assert dag.get_task("approval_gate").upstream_task_ids == channels
    assert dag.max_active_runs == 1 and dag.catchup is False
    # the mapped harvest (one instance per slice) and the slice planning ask the partner: its pool bounds them
    assert {t.task_id for t in dag.tasks if t.pool == partner.pool} >= {"freeze_window", "plan_slices", "harvest_changes"}
    assert dag.get_task("harvest_changes").is_mapped
    assert dag.get_task("advance_cursor").pool == "default_pool"  # only tasks that ask the partner are pooled
    assert dag.get_task("check_quality").upstream_task_ids == {"apply_changes"}
    assert set(dag.params.get_param("mode").schema["enum"]) == {"incremental", "full", "window"}


def _tasks_reaching_the_partner() -> dict[str, set[str]]:
    """Per DAG builder, the task ids whose callable reaches ``build_adapter`` (a request to
    the partner), followed through airflow/tasks.py's own functions, nested ones included."""
    from partner_harvest.airflow import dag_factory, tasks

    module = ast.parse(Path(tasks.__file__).read_text(encoding="utf-8"))
    calls = {node.name: {call.func.id for call in ast.walk(node)
                         if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)}
             for node in module.body if isinstance(node, ast.FunctionDef)}
    reaching = {"build_adapter"}
    while grown := {name for name, called in calls.items() if called & reaching} - reaching:
        reaching |= grown
    factory = ast.parse(Path(dag_factory.__file__).read_text(encoding="utf-8"))
    found: dict[str, set[str]] = {}
    for builder in (n for n in factory.body if isinstance(n, ast.FunctionDef) and n.name.startswith("build_")):
        for inner in (n for n in ast.walk(builder) if isinstance(n, ast.FunctionDef) and n is not builder):
            task_ids = [kw.value.value for dec in inner.decorator_list if isinstance(dec, ast.Call)
                        for kw in dec.keywords if kw.arg == "task_id" and isinstance(kw.value, ast.Constant)]
            used = {call.func.attr for call in ast.walk(inner) if isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", None) == "tasks"}
            if task_ids and used & reaching:
                found.setdefault(builder.name, set()).add(str(task_ids[0]))
    return found


@pytest.mark.parametrize("partner", load_partners(), ids=lambda p: p.id)
def test_every_task_that_asks_the_partner_runs_in_its_pool(dagbag: DagBag, partner: Partner) -> None:
    """The pool bounds the requests of the whole run: the freeze, the plan's probes, every
    slice and its completeness checks, and the apply's re-harvest of a lost channel."""
    reaching = _tasks_reaching_the_partner()
    assert reaching["build_harvest_dag"] >= {"freeze_window", "plan_slices", "harvest_changes", "apply_changes"}
    for kind, builder in (("harvest", "build_harvest_dag"), ("reconcile", "build_reconcile_dag")):
        dag = dagbag.get_dag(f"{kind}_{partner.id}")
        outside = {task_id: dag.get_task(task_id).pool for task_id in reaching[builder] & set(dag.task_ids)
                   if dag.get_task(task_id).pool != partner.pool}
        assert outside == {}, f"tasks of {dag.dag_id} that send the partner requests outside pool {partner.pool}"


MIXED_REGISTRY = """\
partners:
  - {id: good, protocol: oai-pmh, conn_id: c}
  - {id: broken, protocol: oai-pmh, conn_id: c, lag: whenever}
  - {id: library, protocol: sierra, conn_id: s, options: {export: {limit: 2000, mapping: x}}}
"""


def test_one_bad_entry_is_that_partners_error_and_the_others_still_load(registry: Callable[[str], Path], airflow_db: None) -> None:
    from airflow.dag_processing.dagbag import DagBag

    path = registry(MIXED_REGISTRY)
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert {"harvest_good", "reconcile_good"} <= set(bag.dag_ids)
    assert "advance_cursor" in bag.get_dag("harvest_good").task_ids
    # The import error lives in its own file, one line per invalid entry.
    assert {Path(p).name for p in bag.import_errors} == {"partner_registry_check.py"}
    (message,) = bag.import_errors.values()
    assert f"{path}: partner 'broken', field 'lag': not a duration" in message
    assert f"{path}: partner 'library', field 'options.export.mapping': unknown field" in message
    # Each invalid partner keeps its DAG names, as one task failing with its own error.
    for dag_id, field in (("harvest_broken", "'lag'"), ("reconcile_broken", "'lag'"),
                          ("harvest_library", "'options.export.mapping'")):
        dag = bag.get_dag(dag_id)
        assert dag.task_ids == ["registry_error"] and "registry-error" in dag.tags
        assert str(path) in dag.description and f"field {field}" in dag.description


def test_dag_processor_keeps_the_valid_partners_scheduled(registry: Callable[[str], Path], airflow_db: None) -> None:
    """What the dag processor writes: an import error in a DAG file marks every DAG of that
    file stale and unschedulable, so it must only ever land on the check file."""
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.errors import ParseImportError
    from airflow.utils.session import create_session

    registry(MIXED_REGISTRY)
    with create_session() as session:
        if session.get(DagBundleModel, "test-registry") is None:
            session.add(DagBundleModel(name="test-registry"))
    bag = BundleDagBag(dag_folder=str(ROOT / "dags"), bundle_path=ROOT / "dags", bundle_name="test-registry")
    sync_bag_to_db(bag, "test-registry", None)
    with create_session() as session:
        models = {m.dag_id: m for m in session.query(DagModel).filter(DagModel.bundle_name == "test-registry")}
        errors = {e.filename: e.stacktrace for e in
                  session.query(ParseImportError).filter(ParseImportError.bundle_name == "test-registry")}
    for dag_id in ("harvest_good", "reconcile_good", "harvest_broken"):
        assert not models[dag_id].has_import_errors and not models[dag_id].is_stale, dag_id
    assert set(errors) == {"partner_registry_check.py"}
    assert "partner 'broken', field 'lag'" in (errors["partner_registry_check.py"] or "")


def test_error_dag_fails_and_alerts_with_the_entrys_message(registry: Callable[[str], Path], airflow_db: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from airflow.utils.state import DagRunState

    from partner_harvest.airflow.dag_factory import build_dags
    from tests.support.webhook import Sink

    path = registry(MIXED_REGISTRY)
    sink = Sink()
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": sink.url}))
    try:
        (dag,) = build_dags("harvest", "harvest_broken")
        assert dag.test().state == DagRunState.FAILED
    finally:
        sink.close()
    (alert,) = sink.bodies
    assert alert["harvest"]["partner"] == "broken" and alert["harvest"]["task_id"] == "registry_error"
    assert alert["harvest"]["cause"].startswith("registry entry invalid: "), alert["harvest"]["cause"]
    assert f"{path}: partner 'broken', field 'lag'" in alert["harvest"]["details"]


def test_unreadable_registry_is_an_import_error_of_the_dag_files(registry: Callable[[str], Path], airflow_db: None) -> None:
    from airflow.dag_processing.dagbag import DagBag

    path = registry("partners: [\n")
    errors = DagBag(dag_folder=str(ROOT / "dags")).import_errors
    assert {Path(p).name for p in errors} == {"partner_harvest.py", "partner_reconcile.py"}
    for message in errors.values():
        assert f"{path}: not valid YAML" in message


def test_error_dag_names_never_clash_with_a_valid_partner(registry: Callable[[str], Path]) -> None:
    from partner_harvest.airflow.dag_factory import build_dags

    registry("partners:\n  - {id: a_b, protocol: oai-pmh, conn_id: c}\n"
             "  - {id: 'a b', protocol: oai-pmh, conn_id: c}\n  - {protocol: oai-pmh}\n")
    ids = sorted(d.dag_id for d in build_dags("harvest"))
    assert ids == ["harvest_a_b", "harvest_a_b__invalid1", "harvest_entry3"]


def test_the_plugin_refuses_a_plugins_folder_holding_its_sources(tmp_path: Path) -> None:
    """No .airflowignore hides the sources: Airflow's plugins folder must not hold them (its
    loader would import every library file again as a top-level module). A deployment that
    copies plugins/ there gets one import error saying so, not a library loaded twice."""
    from partner_harvest.airflow.plugin import PluginsFolderHoldsSources, refuse_plugins_folder_with_sources

    root = Path(__file__).resolve().parents[2]
    for holding in (root / "plugins", root):
        with pytest.raises(PluginsFolderHoldsSources, match=r"plugins_folder .* holds the library's sources"):
            refuse_plugins_folder_with_sources(str(holding))
    refuse_plugins_folder_with_sources(str(tmp_path))  # Airflow's default, $AIRFLOW_HOME/plugins: fine
    refuse_plugins_folder_with_sources(None)
    assert [p for p in (root / "plugins").rglob(".airflowignore")] == []


def test_pools_are_synced_from_the_registry(tmp_path: Path, airflow_api: str) -> None:
    from airflow.models.pool import Pool

    from partner_harvest.airflow.pools import sync_pools
    from partner_harvest.registry import load_registry

    registry = tmp_path / "partners.yaml"
    registry.write_text("partners:\n  - {id: pooled, protocol: oai-pmh, conn_id: c, pool_slots: 2}\n"
                        "  - {id: unpooled, protocol: oai-pmh, conn_id: c, lag: never}\n")
    loaded = load_registry(registry)
    assert sync_pools(loaded) == [("partner_pooled", 2, "Concurrent requests to partner pooled (oai-pmh, Connection c)")]
    sync_pools(loaded)  # idempotent
    assert present(Pool.get_pool("partner_pooled")).slots == 2
    assert Pool.get_pool("partner_unpooled") is None  # an invalid entry runs nothing


def test_pool_check_names_a_missing_pool(registry: Callable[[str], Path], airflow_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow.models.pool import Pool

    from partner_harvest.cli import main

    registry("partners:\n  - {id: forgotten, protocol: oai-pmh, conn_id: c}\n")
    Pool.delete_pool("partner_forgotten") if Pool.get_pool("partner_forgotten") else None
    assert main(["sync-pools", "--check"]) == 1
    assert "pool partner_forgotten is missing: the tasks of partner forgotten will never be scheduled" in capsys.readouterr().err
    assert main(["sync-pools"]) == 0 and main(["sync-pools", "--check"]) == 0


def test_task_arguments_follow_the_registry(registry: Callable[[str], Path]) -> None:
    """retries, retry_delay, max_retry_delay, execution_timeout of every task come from the
    partner's entry; keys it leaves out keep the factory's defaults."""
    from datetime import timedelta

    from partner_harvest.airflow import dag_factory
    from partner_harvest.registry import load_registry

    path = registry(
        "partners:\n"
        "  - {id: tuned, protocol: sierra, conn_id: c, retries: 7, retry_delay: 3s, max_retry_delay: 5s,"
        " execution_timeout: 90m}\n"
        "  - {id: plain, protocol: oai-pmh, conn_id: c}\n")
    plain, tuned = load_registry(path).partners
    for dag in (dag_factory.build_harvest_dag(tuned), dag_factory.build_reconcile_dag(tuned)):
        for task in dag.tasks:
            assert (task.retries, task.retry_delay, task.max_retry_delay, task.execution_timeout) == (
                7, timedelta(seconds=3), timedelta(seconds=5), timedelta(minutes=90)), (dag.dag_id, task.task_id)
    defaults = dag_factory.DEFAULT_ARGS
    for task in dag_factory.build_harvest_dag(plain).tasks:
        assert (task.retries, task.retry_delay, task.max_retry_delay, task.execution_timeout) == (
            3, defaults["retry_delay"], defaults["max_retry_delay"], defaults["execution_timeout"]), task.task_id
