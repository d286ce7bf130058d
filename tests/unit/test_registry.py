"""The registry: defaults, and errors that name the file, the partner and the field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from partner_harvest.registry import (
    DEFAULT_PARTNERS_FILE,
    SCHEMA_FILE,
    RegistryError,
    cursor_key,
    get_partner,
    load_partners,
    load_registry,
    schema_text,
)


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


# -- one bad entry stops only its partner --------------------------------------------------

def test_an_invalid_entry_leaves_the_others_usable(tmp_path: Path) -> None:
    path = write(tmp_path, """
partners:
  - {id: good, protocol: oai-pmh, conn_id: c}
  - {id: bad, protocol: oai-pmh, conn_id: c, lag: whenever}
  - {id: twin, protocol: oai-pmh, conn_id: c}
  - {id: twin, protocol: sierra, conn_id: d}
""")
    registry = load_registry(path)
    assert [p.id for p in registry.partners] == ["good"]
    assert [(e.partner, e.field) for e in registry.errors] == [("bad", "lag"), ("twin", "id")]
    assert get_partner("good", path).conn_id == "c"
    with pytest.raises(RegistryError, match="partner 'bad', field 'lag': not a duration"):
        get_partner("bad", path)
    with pytest.raises(RegistryError, match="partner 'bad'"):
        load_partners(path)  # strict, for tools that need the whole registry


# -- cursor keys cannot collide -----------------------------------------------------------

@pytest.mark.parametrize("pid", ["x__deletions", "a__b", "x_", "_x"])
def test_ids_that_could_share_a_cursor_key_are_rejected(tmp_path: Path, pid: str) -> None:
    path = write(tmp_path, f"partners:\n  - {{id: x, protocol: sierra, conn_id: c}}\n"
                           f"  - {{id: '{pid}', protocol: oai-pmh, conn_id: c}}\n")
    registry = load_registry(path)
    assert [p.id for p in registry.partners] == ["x"]
    (error,) = registry.errors
    assert error.partner == pid and error.field == "id" and "'__'" in str(error)


def test_cursor_keys_are_unique_per_partner_and_channel() -> None:
    assert cursor_key("x", "deletions") == "harvest_cursor__x__deletions"
    with pytest.raises(ValueError, match="x__deletions"):
        cursor_key("x__deletions")
    ids = ["x", "x_deletions", "deletions", "x_y", "x_y_deletions", "a1"]
    keys = [cursor_key(pid, channel) for pid in ids for channel in (None, "deletions")]
    assert len(set(keys)) == len(keys)


# -- options are typed ---------------------------------------------------------------------

@pytest.mark.parametrize("options,field,problem", [
    ("{export: {limit: 2000, mapping: x}}", "options.export.mapping",
     "unknown field (known: limit, max_rate_limit_waits, max_sleep_seconds, params, rate_limit_wait)"),
    ("{export: {limit: 0}}", "options.export.limit", "greater than or equal to 1"),
    ("{export: {params: {id: '[1,]'}}}", "options.export.params", "id are set by the harvester"),
    ("{export: {params: {locations: [a, b]}}}", "options.export.params.locations", ""),
    ("{http: {read_timeout: 10, retriez: 2}}", "options.http.retriez", "unknown field"),
    ("{http: {retries: '5'}}", "options.http.retries", "valid integer"),
    ("{sierra: {server_error_tries: 0}}", "options.sierra.server_error_tries", "greater than or equal to 1"),
    ("{sierra: {token_ttl: 5}}", "options.sierra.token_ttl", "unknown field"),
    ("{limits: {max_record_bytes: big}}", "options.limits.max_record_bytes", "valid integer"),
    ("{completeness: {list_identifiers: 'yes'}}", "options.completeness.list_identifiers", "valid boolean"),
    ("{colour: blue}", "options.colour",
     "unknown field (known: completeness, content_check, export, files, http, iiif, limits, oai, politeness, reconcile, "
     "sierra, validation)"),
    ("{validation: {marc.no_01: warn}}", "options.validation", "unknown validation check 'marc.no_01'; known checks:"),
    ("{validation: {store.unstorable: warn}}", "options.validation", "cannot be overridden"),
    ("{validation: {marc.no_001: ignore}}", "options.validation", "must be reject or warn"),
])
def test_bad_options_name_the_key(tmp_path: Path, options: str, field: str, problem: str) -> None:
    path = write(tmp_path, f"partners:\n  - {{id: lib, protocol: sierra, conn_id: c, options: {options}}}\n")
    (error,) = load_registry(path).errors
    assert error.field == field and problem in error.problem and f"field '{field}'" in str(error)


def test_options_defaults_and_pass_through(tmp_path: Path) -> None:
    path = write(tmp_path, """
partners:
  - {id: museum, protocol: oai-pmh, conn_id: c, options: {http: {read_timeout: 30}}}
  - id: lib
    protocol: sierra
    conn_id: c
    options:
      http: {retry_statuses: [429, 503]}
      sierra: {refresh_margin: 30}
      export: {limit: 5000, params: {mapping: marc21, locations: 3}}
      limits: {max_record_bytes: 1024}
      completeness: {list_identifiers: true}
      validation: {marc.no_001: reject, marc.no_title: warn}
""")
    lib, museum = load_partners(path)
    from partner_harvest.registry import Options
    from partner_harvest.transport import HttpPolicy

    assert museum.options == Options(http=HttpPolicy(read_timeout=30))  # every other key its default
    assert museum.options.limits.max_record_bytes == 8 * 1024 * 1024 and museum.options.reconcile.verify_limit == 1000
    assert museum.options.oai.max_window_splits == 12 and not museum.options.completeness.list_identifiers
    assert lib.options.export.limit == 5000 and lib.options.export.params == {"mapping": "marc21", "locations": 3}
    assert lib.options.http.retry_statuses == frozenset({429, 503})
    assert lib.options.sierra.model_dump(exclude_unset=True) == {"refresh_margin": 30}
    assert lib.options.limits.max_record_bytes == 1024 and lib.options.completeness.list_identifiers
    assert lib.run_deadline == timedelta(hours=20)
    assert lib.options.validation == {"marc.no_001": "reject", "marc.no_title": "warn"}


def test_every_http_policy_field_is_an_allowed_option(tmp_path: Path) -> None:
    """options.http is HttpPolicy itself, so a field added there is accepted here."""
    from partner_harvest.transport import HttpPolicy

    policy = HttpPolicy()
    path = write(tmp_path, "partners:\n  - {id: m, protocol: oai-pmh, conn_id: c, options: {http: "
                 + policy.model_dump_json() + "}}\n")
    (partner,) = load_partners(path)
    assert partner.options.http == policy and partner.options.http.model_fields_set == set(HttpPolicy.model_fields)


def test_sierra_only_options_on_an_oai_partner(tmp_path: Path) -> None:
    path = write(tmp_path, "partners:\n  - {id: m, protocol: oai-pmh, conn_id: c, options: {export: {limit: 5}}}\n")
    (error,) = load_registry(path).errors
    assert error.field == "options" and "options.export applies to protocol sierra only" in str(error)


# -- the published JSON Schema -------------------------------------------------------------

def test_committed_schema_is_the_generated_one() -> None:
    """Regenerate with: .venv/bin/python scripts/gen_docs.py"""
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text()


def test_schema_accepts_the_project_registry_and_rejects_unknown_keys() -> None:
    import json

    import jsonschema
    import yaml

    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    project = yaml.safe_load(DEFAULT_PARTNERS_FILE.read_text(encoding="utf-8"))
    jsonschema.validate(project, schema)
    assert "yaml-language-server: $schema=partners.schema.json" in DEFAULT_PARTNERS_FILE.read_text().splitlines()[0]
    project["partners"][1]["options"]["export"]["mapping"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="mapping"):
        jsonschema.validate(project, schema)


# -- Airflow task arguments (retries, retry_delay, max_retry_delay, execution_timeout) ------------------------------------------------

def test_airflow_task_arguments_are_read_and_default_to_unset(tmp_path: Path) -> None:
    path = write(tmp_path, """
partners:
  - {id: big, protocol: oai-pmh, conn_id: c, retries: 20, retry_delay: 30s, max_retry_delay: 1h,
     execution_timeout: 18h}
  - {id: small, protocol: oai-pmh, conn_id: c}
""")
    big, small = load_partners(path)
    assert (big.retries, big.retry_delay, big.max_retry_delay, big.execution_timeout) == (
        20, timedelta(seconds=30), timedelta(hours=1), timedelta(hours=18))
    # Unset: the DAG factory's defaults apply (dag_factory.DEFAULT_ARGS).
    assert (small.retries, small.retry_delay, small.max_retry_delay, small.execution_timeout) == (3, None, None, None)


@pytest.mark.parametrize("keys,field,problem", [
    ("retries: 21", "retries", "less than or equal to 20"),
    ("retries: -1", "retries", "greater than or equal to 0"),
    ("retries: '3'", "retries", "valid integer"),
    ("retry_delay: 0", "retry_delay", "positive duration"),
    ("retry_delay: 0s", "retry_delay", "positive duration"),
    ("execution_timeout: 0m", "execution_timeout", "positive duration"),
    ("execution_timeout: whenever", "execution_timeout", "not a duration"),
    ("max_retry_delay: -5", "max_retry_delay", "not a duration"),
    ("retry_delay: 10m, max_retry_delay: 5m", "max_retry_delay", "shorter than retry_delay (600s)"),
])
def test_bad_airflow_task_arguments_name_partner_and_field(tmp_path: Path, keys: str, field: str,
                                                           problem: str) -> None:
    path = write(tmp_path, f"partners:\n  - {{id: big, protocol: oai-pmh, conn_id: c, {keys}}}\n")
    (error,) = load_registry(path).errors
    assert (error.partner, error.field) == ("big", field)
    assert f"partner 'big', field '{field}'" in str(error) and problem in str(error), str(error)


# -- slicing.sets ----------------------------------------------------------------------------

def test_slicing_sets_are_read_as_a_tuple(tmp_path: Path) -> None:
    path = write(tmp_path, "partners:\n  - {id: museum, protocol: oai-pmh, conn_id: c,"
                           " slicing: {sets: ['type:painting', 'type:print'], max_slices: 4}}\n")
    assert get_partner("museum", path).slicing.sets == ("type:painting", "type:print")


@pytest.mark.parametrize("entry,problem", [
    ("protocol: sierra, slicing: {sets: [a, b]}", "protocol oai-pmh only"),
    ("protocol: oai-pmh, set: a, slicing: {sets: [a, b]}", "cannot be combined with set"),
    ("protocol: oai-pmh, slicing: {sets: [a, a]}", "listed twice"),
    ("protocol: oai-pmh, slicing: {sets: [a]}", "2 to max_slices (8) sets"),
    ("protocol: oai-pmh, slicing: {sets: [a, b, c], max_slices: 2}", "2 to max_slices (2) sets, one slice each; 3 given"),
    ("protocol: oai-pmh, slicing: {sets: [a, 'b c']}", "should match pattern"),
])
def test_bad_slicing_sets_are_refused_with_the_reason(tmp_path: Path, entry: str, problem: str) -> None:
    path = write(tmp_path, f"partners:\n  - {{id: museum, conn_id: c, {entry}}}\n")
    (error,) = load_registry(path).errors
    assert problem in str(error)


def test_reconcile_budget_is_per_partner_and_oai_only(tmp_path: Path) -> None:
    path = write(tmp_path, "partners:\n"
                           "  - {id: museum, protocol: oai-pmh, conn_id: c, options: {reconcile: {verify_limit: 5000}}}\n"
                           "  - {id: plain, protocol: oai-pmh, conn_id: c}\n"
                           "  - {id: library, protocol: sierra, conn_id: c, options: {reconcile: {verify_limit: 10}}}\n"
                           "  - {id: none, protocol: oai-pmh, conn_id: c, options: {reconcile: {verify_limit: 0}}}\n")
    registry = load_registry(path)
    assert get_partner("museum", path).options.reconcile.model_dump() == {"verify_limit": 5000, "bulk_missing_threshold": 500}
    assert get_partner("plain", path).options.reconcile.model_dump() == {"verify_limit": 1000, "bulk_missing_threshold": 500}
    problems = {e.partner: str(e) for e in registry.errors}
    assert "options.reconcile applies to protocol oai-pmh only" in problems["library"]
    assert "greater than or equal to 1" in problems["none"]


# -- cron schedules are checked by croniter -----------------------------------------------

@pytest.mark.parametrize("key,cron", [("schedule", "61 * * * *"), ("schedule", "0 25 * * *"),
                                      ("reconcile_schedule", "0 4 * * 8"), ("schedule", "*/0 * * * *")])
def test_an_impossible_cron_is_one_line_naming_the_partner(tmp_path: Path, key: str, cron: str) -> None:
    path = write(tmp_path, f"partners:\n  - {{id: clock, protocol: oai-pmh, conn_id: c, {key}: '{cron}'}}\n")
    (error,) = load_registry(path).errors
    message = str(error)
    assert "\n" not in message and error.partner == "clock" and error.field == key
    assert f"partner 'clock', field '{key}'" in message and cron in message


def test_a_valid_cron_passes(tmp_path: Path) -> None:
    path = write(tmp_path, "partners:\n  - {id: clock, protocol: oai-pmh, conn_id: c, schedule: '*/15 1-5 * * mon-fri'}\n")
    assert load_partners(path)[0].schedule == "*/15 1-5 * * mon-fri"


def test_every_registry_field_is_described_in_the_schema() -> None:
    """The registry reference is generated from the schema: a field without a description
    would be a blank line there."""
    from partner_harvest.registry import registry_schema

    schema = registry_schema()
    models = {"registry": schema, **schema["$defs"]}
    blank = [f"{model}.{name}" for model, definition in models.items()
             for name, prop in definition.get("properties", {}).items() if not prop.get("description")]
    assert blank == []


def test_a_registry_shaped_mapping_parses_like_the_file() -> None:
    from partner_harvest.registry import Partner, parse_registry

    registry = parse_registry({"partners": [{"id": "m", "protocol": "oai-pmh", "conn_id": "c", "set": "s"},
                                            {"id": "bad", "protocol": "oai-pmh", "conn_id": "c", "lag": "soon"}]})
    assert [p.id for p in registry.partners] == ["m"] and registry.partners[0].set_spec == "s"
    assert [(e.partner, e.field) for e in registry.errors] == [("bad", "lag")]
    assert Partner.model_validate({"id": "m", "protocol": "oai-pmh", "conn_id": "c", "set": "s"}) == registry.partners[0]
