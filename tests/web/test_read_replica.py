"""`pgjobs serve --read-dsn` (``create_app(read_dsn=...)``, ``App(read_dsn=...)``) on a real
primary and standby: the statistics, listings, dashboard pages and /metrics read the standby
(proved by pausing its replay: they show the old counts, and the lag), while enqueues and actions
go to the primary; a read DSN that leads to a primary reads 0 behind; a standby that is down
makes those reads answer 503 naming it, while actions go on."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import App, migrate
from pgjobs.db.dsn import normalize_dsn
from pgjobs.web import create_app
from tests.support.cluster import Pair, free_port, replicated_pair
from tests.support.helpers import (
    assert_one_line_error,
    pgjobs_env,
    pgjobs_process,
    run,
    scalar,
    wait_until,
)
from tests.web.conftest import AUTH, TOKEN, TestClient, assert_error


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with replicated_pair(synchronous=False) as built:
        migrate.upgrade(normalize_dsn(built.primary.url(), "test"))
        yield built


@pytest.fixture
def primary(pair: Pair) -> Iterator[psycopg.Connection[Any]]:
    with pair.primary.connect() as conn:
        conn.execute("TRUNCATE queued_jobs, archived_jobs, dead_letter")
        yield conn


@pytest.fixture
def standby(pair: Pair, primary: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    with pair.standby.connect() as conn:
        caught_up(primary, conn)
        yield conn
        conn.execute("SELECT pg_wal_replay_resume()")


def caught_up(primary: psycopg.Connection[Any], standby: psycopg.Connection[Any]) -> None:
    """Wait until the standby replayed everything the primary wrote so far."""
    target = scalar(primary, "SELECT pg_current_wal_lsn()::text")
    wait_until(
        lambda: scalar(
            standby, "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), %s::pg_lsn) >= 0", [target]
        ),
        timeout=30,
        what="the standby caught up",
    )


def paused(standby: psycopg.Connection[Any], primary: psycopg.Connection[Any]) -> None:
    """Pause the standby's replay, and wait until it received WAL it does not replay."""
    standby.execute("SELECT pg_wal_replay_pause()")
    wait_until(
        lambda: scalar(standby, "SELECT pg_get_wal_replay_pause_state()") == "paused",
        timeout=30,
        what="replay paused",
    )


def ready(client: TestClient) -> int:
    stats = client.get("/api/v1/stats")
    assert stats.status_code == 200, stats.text
    return sum(queue["ready"] for queue in stats.json())


def metric(client: TestClient, name: str) -> float:
    body = client.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == name and sample.labels.get("state", "ready") == "ready"
    )


@pytest.fixture
def web(pair: Pair) -> FastAPI:
    app = App(pair.primary.url(), read_dsn=pair.standby.url(), check_task_names=False)
    return create_app(app, tokens=[TOKEN], pool_size=2)


def test_reads_go_to_the_standby_and_say_how_far_behind_it_is(web, primary, standby):
    with App(pair_url(primary), check_task_names=False, pool_size=1) as app:
        old = [app.enqueue("replica.job", {"n": n}) for n in range(2)]
    caught_up(primary, standby)
    with TestClient(web, headers=AUTH) as client:
        assert ready(client) == 2
        paused(standby, primary)
        with App(pair_url(primary), check_task_names=False, pool_size=1) as app:
            new = [app.enqueue("replica.job", {"n": n}) for n in range(3)]
        wait_until(
            lambda: scalar(standby, "SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()"),
            timeout=30,
            what="the standby received WAL it does not replay",
        )

        # The reads: the standby's old counts, and how far behind it is.
        stats = client.get("/api/v1/stats")
        assert sum(q["ready"] for q in stats.json()) == 2, "read on the paused standby"
        assert stats.headers["X-Pgjobs-Read-From"] == "standby"
        assert float(stats.headers["X-Pgjobs-Replica-Lag-Seconds"]) > 0
        replica = client.get("/api/v1/stats", params={"verbose": "true"}).json()["replica"]
        assert replica["standby"] and replica["replay_paused"] and replica["pending_bytes"] > 0
        assert replica["lag_seconds"] > 0
        listed = client.get("/api/v1/jobs").json()["jobs"]
        assert sorted(job["id"] for job in listed) == sorted(old)
        assert metric(client, "pgjobs_jobs") == 2
        assert metric(client, "pgjobs_replica_lag_seconds") > 0
        page = client.get("/")
        assert page.status_code == 200, page.text
        assert "Read from a standby" in page.text and "replay paused" in page.text

        # The writes and actions: on the primary, whatever the standby shows.
        cancelled = client.post(f"/api/v1/jobs/{new[0]}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        enqueued = client.post("/api/v1/jobs", json={"task": "replica.job", "payload": {}})
        assert enqueued.status_code == 201, enqueued.text
        assert scalar(primary, "SELECT count(*) FROM queued_jobs") == 5 - 1 + 1
        assert ready(client) == 2, "still the standby's view"

        standby.execute("SELECT pg_wal_replay_resume()")
        wait_until(lambda: ready(client) == 5, timeout=30, what="the standby caught up")


def pair_url(conn: psycopg.Connection[Any]) -> str:
    """The URL of the server ``conn`` is connected to (the test's primary)."""
    return f"postgresql://postgres@127.0.0.1:{conn.info.port}/postgres"


def test_a_read_dsn_that_leads_to_a_primary_reads_0_behind(pair, primary):
    web = create_app(dsn=pair.primary.url(), read_dsn=pair.primary.url(), tokens=[TOKEN])
    with TestClient(web, headers=AUTH) as client:
        stats = client.get("/api/v1/stats", params={"verbose": "true"})
        assert stats.headers["X-Pgjobs-Read-From"] == "primary"
        assert stats.json()["replica"]["lag_seconds"] == 0
        assert "Read from a primary, not behind" in client.get("/").text


def test_pgjobs_serve_reads_the_read_dsn(pair, primary, standby):
    port = free_port()
    env = {**pgjobs_env(pair.primary.url()), "PGJOBS_API_TOKENS": TOKEN}
    with pgjobs_process(
        env, "serve", "--port", str(port), "--read-dsn", pair.standby.url(), "--pool-size", "2"
    ) as serve:
        url = f"http://127.0.0.1:{port}/api/v1/stats?verbose=true"

        def answer() -> dict[str, Any] | None:
            request = urllib.request.Request(url, headers=AUTH)
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    document: dict[str, Any] = json.load(response)
                    return document
            except OSError:
                time.sleep(0.1)
                return None

        document = wait_until(answer, timeout=30, what="pgjobs serve answers", procs=[serve])
        assert document["replica"]["standby"] is True


def test_a_standby_that_is_down_fails_the_reads_clearly_and_actions_go_on(pair, primary):
    with App(pair_url(primary), check_task_names=False, pool_size=1) as app:
        job = app.enqueue("replica.job", {})
    pair.standby.stop()
    try:
        web = create_app(dsn=pair.primary.url(), read_dsn=pair.standby.url(), tokens=[TOKEN])
        with TestClient(web, headers=AUTH) as client:
            message = assert_error(client.get("/api/v1/stats"), 503, "database_unavailable")
            assert f"127.0.0.1:{pair.standby.port}" in message and "read_dsn" in message
            assert client.get("/").status_code == 503
            cancelled = client.post(f"/api/v1/jobs/{job}/cancel")
            assert cancelled.status_code == 200, cancelled.text
    finally:
        pair.standby.start()


def test_a_bad_read_dsn_is_one_line_and_exit_2(capsys):
    code, out, err = run(
        capsys,
        "serve",
        "--insecure-no-auth",
        "--dsn",
        "postgresql://postgres@127.0.0.1:1/x",
        "--read-dsn",
        "mysql://root:hunter22@h/x",
    )
    assert code == 2
    assert_one_line_error(code, err, "--read-dsn", "postgresql://")
    assert "hunter22" not in out + err
