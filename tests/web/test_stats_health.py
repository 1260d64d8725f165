"""/api/v1/stats (the document of `pgjobs stats --json`), /api/v1/workers, /healthz and /readyz,
and the app mounted under a prefix of another application."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from fastapi import FastAPI

from pgjobs.db.dsn import Dsn
from tests.support.admin_factories import bury, claim_one
from tests.support.helpers import run, wait_until
from tests.web.conftest import AUTH, TestClient, assert_error


def test_stats_is_the_document_of_pgjobs_stats_json(
    client: TestClient, conn: psycopg.Connection[Any], dsn: Dsn, capsys: Any
) -> None:
    client.post("/api/v1/jobs/batch", json={"jobs": [{"task": "t"}, {"task": "t", "queue": "q"}]})
    bury(conn, 2, queue="q")
    code, out, _ = run(capsys, "stats", "--json", "--dsn", dsn.url)
    assert code == 0
    from_cli = json.loads(out)
    from_api = client.get("/api/v1/stats").json()
    assert [q["queue"] for q in from_api] == ["default", "q"]
    assert (from_api[1]["ready"], from_api[1]["dead"]) == (1, 2)
    for row in from_cli + from_api:  # the ages move between the two readings
        row.pop("oldest_ready_age")
    assert from_api == from_cli

    verbose = client.get("/api/v1/stats", params={"verbose": True}).json()
    code, out, _ = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
    assert code == 0
    assert set(verbose) == set(json.loads(out))
    assert {"queues", "workers", "orphaned_leases", "tables", "archive_partitions"} <= set(verbose)
    assert [t["table"] for t in verbose["tables"]][:3] == [
        "queued_jobs",
        "archived_jobs",
        "dead_letter",
    ]


def test_workers_lists_live_workers_with_their_running_jobs(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    assert client.get("/api/v1/workers").json() == {"workers": []}
    conn.execute(
        "INSERT INTO pgjobs_workers (id, host, pid, queues, concurrency, started_at) "
        "VALUES ('w1', 'host-a', 4242, ARRAY['default'], 8, now())"
    )
    job_id = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    claim_one(conn, job_id, owner="w1")
    (worker,) = client.get("/api/v1/workers").json()["workers"]
    assert (worker["id"], worker["host"], worker["pid"], worker["running"]) == (
        "w1",
        "host-a",
        4242,
        1,
    )
    assert worker["queues"] == ["default"]


def test_healthz_and_readyz_need_no_token(anonymous: TestClient) -> None:
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    assert anonymous.get("/readyz").json() == {"status": "ready"}


def test_readyz_is_503_when_the_schema_is_behind(
    make_web: Callable[..., FastAPI], conn: psycopg.Connection[Any]
) -> None:
    version = conn.execute("SELECT version_num FROM pgjobs_alembic_version").fetchone()
    assert version is not None
    conn.execute("UPDATE pgjobs_alembic_version SET version_num = '0001'")
    try:
        with TestClient(make_web()) as client:
            response = client.get("/readyz")
            message = assert_error(response, 503, "schema_missing")
            assert "pgjobs migrate" in message
            assert response.headers["retry-after"] == "5"
            assert client.get("/healthz").status_code == 200
    finally:
        conn.execute("UPDATE pgjobs_alembic_version SET version_num = %s", version)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_database_down_answers_503_with_retry_after() -> None:
    from pgjobs.web import create_app

    down = Dsn(f"postgresql://postgres@127.0.0.1:{_closed_port()}/nowhere", "test")
    web = create_app(dsn=down, tokens=[AUTH["Authorization"].split()[1]], pool_size=1)
    with TestClient(web, headers=AUTH) as client:
        assert client.get("/healthz").status_code == 200
        for response in (
            client.get("/readyz"),
            client.get("/api/v1/jobs/1"),
            client.post("/api/v1/jobs", json={"task": "t"}),
        ):
            message = assert_error(response, 503, "database_unavailable")
            assert response.headers["retry-after"] == "5"
            assert "cannot reach the database" in message


def test_survives_the_termination_of_its_connections(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    first = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    client.post("/api/v1/jobs/batch", json={"jobs": [{"task": "t"}]})  # both pooled connections
    ended = [
        pid
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = 'pgjobs'"
        ).fetchall()
    ]
    assert ended
    conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [ended])
    # pg_terminate_backend only signals: wait until the sessions have ended (their farewell is
    # then in the pooled connections' sockets), as after any restart or kill.
    wait_until(
        lambda: (
            not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [ended]
            ).fetchone()
        ),
        timeout=10,
        what="the terminated sessions to end",
    )
    for _ in range(3):
        response = client.get(f"/api/v1/jobs/{first}")
        assert response.status_code == 200, response.text
    assert client.post("/api/v1/jobs", json={"task": "t"}).status_code == 201


def test_mounted_under_a_prefix_of_another_app(make_web: Callable[..., FastAPI]) -> None:
    site = FastAPI()

    @site.get("/")
    def home() -> dict[str, str]:
        return {"site": "mine"}

    site.mount("/queue", make_web())
    with TestClient(site, headers=AUTH) as client:
        assert client.get("/").json() == {"site": "mine"}
        created = client.post("/queue/api/v1/jobs", json={"task": "t"})
        assert created.status_code == 201, created.text
        assert client.get(f"/queue/api/v1/jobs/{created.json()['id']}").json()["task"] == "t"
        assert client.get("/queue/healthz").json() == {"status": "ok"}
        schema = client.get("/queue/api/v1/openapi.json").json()
        assert "/api/v1/jobs" in schema["paths"]
        assert_error(client.get("/queue/api/v1/nothing"), 404, "not_found")


def test_times_are_iso_8601_with_a_timezone(client: TestClient) -> None:
    job = client.post("/api/v1/jobs", json={"task": "t"}).json()
    created = datetime.fromisoformat(job["created_at"])
    assert created.tzinfo is not None
    assert abs((datetime.now(UTC) - created).total_seconds()) < 3600


def test_database_lost_after_start_is_503_then_recovers(
    client: TestClient, conn: psycopg.Connection[Any], server_url: str
) -> None:
    job_id = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    name = conn.info.dbname
    server = psycopg.connect(server_url, autocommit=True)  # a database may not lock itself out
    server.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    try:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = 'pgjobs'"
        )
        # The pool cannot reconnect: the request gives up after the pool's wait, never hangs.
        response = client.get(f"/api/v1/jobs/{job_id}")
        assert_error(response, 503, "database_unavailable")
        assert response.headers["retry-after"] == "5"
        assert_error(client.get("/readyz"), 503, "database_unavailable")
    finally:
        server.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        server.close()
    wait_until(
        lambda: client.get(f"/api/v1/jobs/{job_id}").status_code == 200,
        timeout=60,
        what="the API answering again once the database takes connections",
    )
