"""The suite's derived URLs (``tests/support/urls.py``) say to libpq exactly what they were asked
to, whatever form the test server's URL takes: a new address leaves nothing of the old one behind
(the embedded server's ``?host=`` socket folder made the PgBouncer tests connect past their
PgBouncer), and every other parameter survives."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.urls import url_with

SERVERS = [
    "postgresql://postgres:postgres@127.0.0.1:5432/postgres",
    "postgresql://postgres:@127.0.0.1:40123/pgjobs_test_1?host=/tmp/pgjobs-test-x/data",
    "postgresql://postgres@/postgres?host=%2Fvar%2Frun%2Fpostgresql&port=5433",
    "postgresql://u:p%40ss@[::1]:5432/app?sslmode=disable&application_name=a%20b",
    "postgresql://u@h1:5432,h2:5433/app?target_session_attrs=read-write",
    "host=/var/run/postgresql port=5432 user=postgres dbname='my db'",
    "hostaddr=127.0.0.1 host=db.internal port=5432 user=u password='p w' dbname=app",
]

CHANGES: list[dict[str, Any]] = [
    {},
    {"host": "127.0.0.1", "port": 6432},
    {"host": "/tmp/elsewhere"},
    {"port": 7000},
    {"user": "reader"},
    {"user": "reader", "password": "s3cr#t/@"},
    {"password": "p w"},
    {"dbname": "pgjobs_no_such_database"},
]


def parsed(url: str) -> dict[str, str]:
    return {key: str(value) for key, value in conninfo_to_dict(url).items() if value is not None}


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("change", CHANGES, ids=lambda change: ",".join(change) or "same")
def test_a_derived_url_is_the_servers_with_only_the_change(server: str, change: dict[str, Any]):
    expected = parsed(server)
    if "host" in change:
        for key in ("host", "hostaddr", "port"):
            expected.pop(key, None)
    if "user" in change:
        expected.pop("password", None)
    expected.update({key: str(value) for key, value in change.items()})
    derived = url_with(server, **change)
    assert derived.startswith("postgresql://")
    assert parsed(derived) == expected


@pytest.mark.parametrize("server", SERVERS)
def test_a_raw_password_is_written_as_given(server: str) -> None:
    derived = url_with(server, user="postgres", raw_password="p#?/@%:x")
    assert derived.startswith("postgresql://postgres:p#?/@%:x@")
