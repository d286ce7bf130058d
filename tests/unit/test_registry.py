"""The registry: defaults, and errors that name the file, the partner and the field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from partner_harvest.registry import RegistryError, load_partners


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "partners.yaml"
    path.write_text(body)
    return path


def test_project_registry_loads() -> None:
    partners = load_partners()
    assert "demo" in {p.id for p in partners}


def test_defaults_and_sorting(tmp_path: Path) -> None:
    path = write(tmp_path, """
partners:
  - {id: zeta, protocol: oai-pmh, conn_id: c1}
  - {id: alpha, protocol: oai-pmh, conn_id: c2, lag: 2h, metadata_prefix: lido, set: "type:print"}
""")
    alpha, zeta = load_partners(path)
    assert (alpha.id, zeta.id) == ("alpha", "zeta")
    assert alpha.lag == timedelta(hours=2) and alpha.set_spec == "type:print"
    assert zeta.metadata_prefix == "auto" and zeta.schedule == "0 2 * * *"
    assert alpha.dag_id == "harvest_alpha" and alpha.cursor_key == "harvest_cursor__alpha"


@pytest.mark.parametrize("entry,field", [
    ("{id: Bad-Id, protocol: oai-pmh, conn_id: c}", "id"),
    ("{id: ok, protocol: ftp, conn_id: c}", "protocol"),
    ("{id: ok, protocol: oai-pmh}", "conn_id"),
    ("{id: ok, protocol: oai-pmh, conn_id: c, lag: soon}", "lag"),
    ("{id: ok, protocol: oai-pmh, conn_id: c, schedule: daily}", "schedule"),
    ("{id: ok, protocol: oai-pmh, conn_id: c, page_size: 5000}", "page_size"),
    ("{id: ok, protocol: oai-pmh, conn_id: c, colour: blue}", "colour"),
])
def test_bad_entries_name_file_partner_and_field(tmp_path: Path, entry: str, field: str) -> None:
    path = write(tmp_path, f"partners:\n  - {entry}\n")
    with pytest.raises(RegistryError) as err:
        load_partners(path)
    message = str(err.value)
    assert str(path) in message and f"field '{field}'" in message
    assert err.value.field == field


def test_duplicate_ids_and_broken_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "partners:\n  - {id: a, protocol: oai-pmh, conn_id: c}\n  - {id: a, protocol: oai-pmh, conn_id: d}\n")
    with pytest.raises(RegistryError, match="partner 'a', field 'id': duplicate"):
        load_partners(path)
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_partners(write(tmp_path, "partners: [\n"))
    with pytest.raises(RegistryError, match="file not found"):
        load_partners(tmp_path / "missing.yaml")


def test_env_variable_points_at_another_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "partners:\n  - {id: other, protocol: oai-pmh, conn_id: c}\n")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(path))
    assert [p.id for p in load_partners()] == ["other"]
