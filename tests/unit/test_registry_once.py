"""The registry is read once per process, and the DAGs split into stable shards.

A task process parsed the DAG file (one registry load) and then called ``get_partner()``
without a cache in four of its six tasks: at 1,000 partners 0.4 CPU-s a load, more than
the rest of a quiet run. ``test_a_task_process_reads_the_registry_once`` fails on that code.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import yaml

from partner_harvest import registry as registry_module
from partner_harvest.airflow import dag_factory, shards
from partner_harvest.registry import RegistryError, get_partner, load_registry


def _entries(*ids: str, broken: str | None = None) -> str:
    lines = ["partners:"]
    for pid in ids:
        lines += [f"  - id: {pid}", "    protocol: oai-pmh", f"    conn_id: partner_{pid}",
                  "    lag: 12h" if pid != broken else "    lag: soon"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def yaml_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a registry file's YAML was parsed (either loader)."""
    count = [0]
    real_load, real_safe = yaml.load, yaml.safe_load

    def load(*args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += 1
        return real_load(*args, **kwargs)

    def safe_load(*args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += 1
        return real_safe(*args, **kwargs)

    monkeypatch.setattr(registry_module.yaml, "load", load)
    monkeypatch.setattr(registry_module.yaml, "safe_load", safe_load)
    return count


def test_a_task_process_reads_the_registry_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                yaml_parses: list[int]) -> None:
    path = tmp_path / "partners.yaml"
    path.write_text(_entries("alpha", "beta", "gamma"), encoding="utf-8")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(path))
    # What a task process does: parse its DAG file for its one DAG, then look its partner up.
    (dag,) = dag_factory.build_dags("harvest", "harvest_beta")
    assert dag.dag_id == "harvest_beta"
    for _ in range(4):
        assert get_partner("beta").id == "beta"
    assert load_registry().partners[1].id == "beta"
    assert yaml_parses[0] == 1


def test_an_edit_is_seen_at_once_even_at_the_same_size_and_mtime(tmp_path: Path) -> None:
    path = tmp_path / "partners.yaml"
    path.write_text(_entries("alpha"), encoding="utf-8")
    assert [p.id for p in load_registry(path).partners] == ["alpha"]
    stat = path.stat()
    path.write_text(_entries("gamma"), encoding="utf-8")  # same length, keyed by content
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert [p.id for p in load_registry(path).partners] == ["gamma"]
    assert get_partner("gamma", path).id == "gamma"
    with pytest.raises(RegistryError, match="no such partner"):
        get_partner("alpha", path)


def test_one_entry_is_validated_alone_with_the_registry_s_errors(tmp_path: Path) -> None:
    path = tmp_path / "partners.yaml"
    path.write_text(_entries("alpha", "beta", broken="beta"), encoding="utf-8")
    assert get_partner("alpha", path).id == "alpha"  # another partner's bad entry does not matter
    with pytest.raises(RegistryError, match="lag") as own:
        get_partner("beta", path)
    assert str(own.value) == str(load_registry(path).error_for("beta"))
    path.write_text(_entries("alpha", "alpha"), encoding="utf-8")
    with pytest.raises(RegistryError, match="duplicate partner id"):
        get_partner("alpha", path)
    path.write_text("partners: [\n", encoding="utf-8")
    with pytest.raises(RegistryError, match="not valid YAML"):
        get_partner("alpha", path)


def test_shards_split_every_dag_exactly_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"p{i:03d}" for i in range(12)]
    path = tmp_path / "partners.yaml"
    path.write_text(_entries(*ids, broken="p007"), encoding="utf-8")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(path))
    whole = {d.dag_id for d in dag_factory.build_dags("reconcile")}
    parts = [{d.dag_id for d in dag_factory.build_dags("reconcile", shard=(k, 4))} for k in range(4)]
    assert sum(len(p) for p in parts) == len(whole) == 12 and set().union(*parts) == whole
    assert all(parts)  # a stable hash spreads 12 ids over 4 shards
    assert dag_factory.shard_of("p001", 4) == zlib.crc32(b"p001") % 4  # the same in every process


def test_the_shard_command_writes_thin_files_and_undoes_them(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / ".airflowignore").write_text("scratch/\n", encoding="utf-8")
    written = shards.write_shards(dags, 3)
    assert sorted(p.name for p in written) == [f"partner_{k}_shard_0{i}.py" for k in ("harvest", "reconcile")
                                               for i in range(3)]
    assert 'shard=(2, 3)' in (dags / "partner_reconcile_shard_02.py").read_text()
    ignored = (dags / ".airflowignore").read_text().splitlines()
    assert ignored[0] == "scratch/" and {"partner_harvest.py", "partner_reconcile.py"} <= set(ignored)
    assert len(shards.write_shards(dags, 2)) == 4 and not (dags / "partner_harvest_shard_02.py").exists()
    assert shards.write_shards(dags, 1) == []
    assert (dags / ".airflowignore").read_text() == "scratch/\n"


def test_touch_marks_the_partner_dag_files_changed(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("partner_harvest.py", "partner_registry_check.py", "example_downstream_jsonl.py"):
        (dags / name).write_text("# dag\n", encoding="utf-8")
        os.utime(dags / name, (1_000_000, 1_000_000))
    shards.write_shards(dags, 2)
    touched = {p.name for p in shards.touch_dag_files(dags)}
    assert touched == {"partner_harvest.py", "partner_registry_check.py", "partner_harvest_shard_00.py",
                       "partner_harvest_shard_01.py", "partner_reconcile_shard_00.py", "partner_reconcile_shard_01.py"}
    assert (dags / "partner_harvest.py").stat().st_mtime > 1_000_000
    assert (dags / "example_downstream_jsonl.py").stat().st_mtime == 1_000_000
