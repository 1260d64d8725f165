"""The framework examples the manual includes (docs/guides/frameworks.md) run against the test
database: FastAPI (a request's row and job in one SQLAlchemy transaction), Django (a job on
Django's connection inside transaction.atomic, and on_commit), and a plain script."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

with warnings.catch_warnings():
    # Starlette asks for its httpx fork (httpx2) when it finds httpx; the client works the same.
    warnings.simplefilter("ignore", UserWarning)
    from starlette.testclient import TestClient

from pgjobs.db.dsn import Dsn
from tests.support.helpers import database_name, pgjobs_env, scalar


def fresh_import(name: str, monkeypatch: pytest.MonkeyPatch, dsn: Dsn) -> ModuleType:
    """Import example ``name`` anew, reading the test database from its environment."""
    monkeypatch.setenv("PGJOBS_DATABASE_URL", dsn.url)
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.fixture
def fastapi_example(monkeypatch, dsn: Dsn) -> Iterator[Any]:
    module = fresh_import("examples.integrations.fastapi_app", monkeypatch, dsn)
    yield module
    module.jobs.close()


def test_fastapi_a_request_commits_its_row_and_job_together(fastapi_example, conn):
    conn.execute("DROP TABLE IF EXISTS example_users")
    with TestClient(fastapi_example.api) as client:
        created = client.post("/signup", json={"email": "ada@example.com"})
        assert created.status_code == 201, created.text
        again = client.post("/signup", json={"email": "ada@example.com"})
        assert again.status_code == 409
    body = created.json()
    job = conn.execute(
        "SELECT task, queue, payload FROM queued_jobs WHERE id = %s", [body["job_id"]]
    ).fetchone()
    assert job == ("signup.welcome", "emails", {"user_id": body["user_id"]})
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 1, "the refused signup left no job"


@pytest.fixture
def django_example(monkeypatch, dsn: Dsn) -> Iterator[Any]:
    pytest.importorskip("django")
    module = fresh_import("examples.integrations.django_app", monkeypatch, dsn)
    from django.conf import settings

    if settings.configured and settings.DATABASES["default"]["NAME"] != database_name(dsn.url):
        pytest.skip("Django was configured for another database in this process")
    module.configure()
    yield module
    from django.db import connections

    connections.close_all()
    module.jobs.close()


def test_django_the_job_commits_and_rolls_back_with_the_atomic_block(django_example, conn):
    conn.execute("DROP TABLE IF EXISTS example_orders")
    order = django_example.place_order("book")
    with pytest.raises(RuntimeError, match="payment refused"):
        django_example.place_order("lamp", fail_after_enqueue=True)
    rows = conn.execute("SELECT payload FROM queued_jobs").fetchall()
    assert rows == [({"order_id": order},)]
    assert scalar(conn, "SELECT count(*) FROM example_orders") == 1
    django_example.place_order_on_commit("pen")
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 2


def test_a_plain_script_enqueues_in_its_transaction_and_works_the_jobs(dsn: Dsn, conn):
    result = subprocess.run(
        [sys.executable, "-m", "examples.integrations.script", "20"],
        env=pgjobs_env(dsn.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"20 jobs done, sum of squares {sum(n * n for n in range(20))}"
    assert scalar(conn, "SELECT count(*) FROM archived_jobs WHERE status = 'succeeded'") == 20
