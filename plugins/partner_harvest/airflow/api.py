"""Airflow's stable REST API for the command line, through the official client
(``apache-airflow-client``, pinned with Airflow in constraints.txt).

Where: ``HARVEST_AIRFLOW_API_URL``, else Airflow's own ``[api] base_url``, else
http://localhost:8080. Who: ``HARVEST_AIRFLOW_API_TOKEN`` (a JWT, as ``POST /auth/token``
returns it), or ``HARVEST_AIRFLOW_API_USER`` and ``HARVEST_AIRFLOW_API_PASSWORD`` exchanged for
one; neither: no token (an Airflow whose auth manager makes everyone an admin, as the
local UI does). The user needs the rights Airflow's UI would need for the same change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import requests
from airflow_client import client as airflow_client
from airflow_client.client.exceptions import ApiException

URL_ENV = "HARVEST_AIRFLOW_API_URL"
TOKEN_ENV = "HARVEST_AIRFLOW_API_TOKEN"
USER_ENV, PASSWORD_ENV = "HARVEST_AIRFLOW_API_USER", "HARVEST_AIRFLOW_API_PASSWORD"
DEFAULT_URL = "http://localhost:8080"
PAGE = 100


class AirflowApiError(Exception):
    """The REST API cannot be reached or refused a call; the message says which and what to do."""


def base_url() -> str:
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV].rstrip("/")
    try:
        from airflow.sdk import conf

        configured = conf.get("api", "base_url", fallback=None)
    except Exception:  # no Airflow configuration here: the default
        configured = None
    return (configured or DEFAULT_URL).rstrip("/")


def _token(url: str) -> str | None:
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if not user:
        return None
    try:
        response = requests.post(f"{url}/auth/token", json={"username": user, "password": password or ""},
                                 timeout=30)
    except requests.RequestException as exc:
        raise AirflowApiError(f"Airflow's API at {url} is unreachable ({type(exc).__name__}); set {URL_ENV}") from None
    if response.status_code >= 400:
        raise AirflowApiError(f"Airflow's API at {url} refused the login of {user} (HTTP {response.status_code})")
    return str(response.json()["access_token"])


@cache
def api_client() -> airflow_client.ApiClient:
    url = base_url()
    return airflow_client.ApiClient(airflow_client.Configuration(host=url, access_token=_token(url)))


@contextmanager
def calling(what: str) -> Iterator[None]:
    """One line for a refused or failed call: the call, Airflow's answer, what to check."""
    try:
        yield
    except ApiException as exc:
        detail = " ".join(str(exc.body or exc.reason or "").split())[:300]
        hint = (f"set {TOKEN_ENV}, or {USER_ENV} and {PASSWORD_ENV}" if exc.status in (401, 403)
                else "see Airflow's api-server log")
        raise AirflowApiError(f"Airflow's API at {base_url()} answered HTTP {exc.status} to {what}: {detail} "
                              f"({hint})") from None
    except Exception as exc:  # urllib3 errors: the server is not there
        if type(exc).__module__.startswith("urllib3"):
            raise AirflowApiError(f"Airflow's API at {base_url()} is unreachable for {what} "
                                  f"({type(exc).__name__}); set {URL_ENV} to the api-server's URL") from None
        raise


def absent(exc: ApiException) -> bool:
    return exc.status == 404


def pools() -> airflow_client.PoolApi:
    return airflow_client.PoolApi(api_client())


def variables() -> airflow_client.VariableApi:
    return airflow_client.VariableApi(api_client())


def connections() -> airflow_client.ConnectionApi:
    return airflow_client.ConnectionApi(api_client())


def dags() -> airflow_client.DAGApi:
    return airflow_client.DAGApi(api_client())


def dag_runs() -> airflow_client.DagRunApi:
    return airflow_client.DagRunApi(api_client())


def task_instances() -> airflow_client.TaskInstanceApi:
    return airflow_client.TaskInstanceApi(api_client())


def all_pools() -> list[Any]:
    """Every pool (the API pages them)."""
    found: list[Any] = []
    with calling("GET /api/v2/pools"):
        while True:
            page = pools().get_pools(limit=PAGE, offset=len(found))
            found += page.pools
            if len(page.pools) < PAGE or len(found) >= page.total_entries:
                return found
