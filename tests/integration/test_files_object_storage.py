"""A file-delivery partner's Connection read through Airflow: its hook opens the location with
Airflow's object storage (ObjectStoragePath; for s3:// the Amazon provider, reading the same
Connection) and the adapter lists and reads through that filesystem; a scheme no provider
registers (an HTTP directory) is left to fsspec."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from include.simulators.files.publisher import Publisher
from partner_harvest.airflow.hooks import hook_for
from partner_harvest.files.spec import SPEC
from partner_harvest.files.storage import Storage
from tests.support.files_harness import FilesHarness, files_partner
from tests.support.s3 import KEY, SECRET, moto_endpoint, moto_s3  # noqa: F401 (fixtures)


def test_an_s3_location_through_airflow_object_storage(moto_s3: Any, conn: psycopg.Connection,  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    museum = Publisher(moto_s3.fs, f"{moto_s3.bucket}/museum")
    museum.create(12)
    museum.full(datetime(2026, 6, 19, tzinfo=timezone.utc))
    conn_id = f"files_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": SPEC.connection.conn_type, "host": f"s3://{moto_s3.bucket}/museum", "login": KEY,
        "password": SECRET, "extra": {"endpoint_url": moto_s3.endpoint, "region_name": "us-east-1"}}))
    endpoint = hook_for(SPEC.name, conn_id).endpoint()
    assert type(endpoint.filesystem).__name__ == "S3FileSystem"  # the Amazon provider's, from the Connection
    storage = Storage.for_endpoint("museum_files", endpoint)
    assert storage.fs is endpoint.filesystem and SECRET not in storage.where

    class Through(FilesHarness):
        def endpoint(self) -> Any:  # the Connection as the DAG's tasks read it
            return endpoint

    harness = Through(endpoint.base_url, conn, files_partner(conn_id=conn_id))
    harness.run()
    assert harness.held() == museum.published_ids() and len(harness.held()) == 12


def test_a_scheme_without_an_airflow_filesystem_is_left_to_fsspec(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = f"files_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": SPEC.connection.conn_type, "host": "https://museum.example/opendata/"}))
    endpoint = hook_for(SPEC.name, conn_id).endpoint()
    assert endpoint.filesystem is None and endpoint.base_url == "https://museum.example/opendata/"
