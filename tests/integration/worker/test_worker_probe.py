"""The worker's /healthz against a real database: a round trip that waits (here on a lock held
by the test) longer than ``stuck_after`` turns /healthz to 503, and it recovers once the trip
lands. /readyz says why it answers 503: "stopping" once the worker was asked to stop, "schema
refused" while its tables are not what it expects."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg

from pgjobs import App, migrate
from pgjobs.db.dsn import Dsn
from pgjobs.worker import Worker
from tests.support.external import run_worker_while
from tests.support.helpers import wait_until


def _get(worker: Worker, path: str) -> tuple[int, dict[str, Any]]:
    assert worker.http_address is not None
    host, port = worker.http_address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_stuck_round_trip_makes_healthz_503_until_it_lands(make_app, dsn: Dsn):
    app: App = make_app()

    @app.task(name="probe.noop")
    def noop() -> None: ...

    said: list[dict[str, Any]] = []

    def scenario(worker: Worker) -> None:
        wait_until(lambda: _get(worker, "/readyz")[0] == 200, what="ready")
        with psycopg.connect(dsn.url) as locker:  # a transaction until rollback
            locker.execute("LOCK TABLE queued_jobs IN ACCESS EXCLUSIVE MODE")

            def stuck() -> dict[str, Any] | None:
                status, body = _get(worker, "/healthz")
                return body if status == 503 else None

            said.append(wait_until(stuck, timeout=30, what="/healthz 503"))
            locker.rollback()
        wait_until(lambda: _get(worker, "/healthz")[0] == 200, timeout=30, what="healthy again")

    run_worker_while(app, scenario, http=("127.0.0.1", 0), stuck_after=2.0)
    [body] = said
    assert body["status"] == "unavailable"
    assert body["reason"].startswith("a round trip to the database has waited ")


def test_readyz_says_stopping_once_asked_to_stop(make_app):
    app: App = make_app()

    @app.task(name="probe.slow")
    def slow() -> None:
        import time

        time.sleep(3)

    app.enqueue("probe.slow", {})
    seen: list[tuple[int, dict[str, Any]]] = []

    def scenario(worker: Worker) -> None:
        wait_until(lambda: worker.slots.busy, what="the job running")
        worker.stop()  # the running job holds the worker for its grace period
        wait_until(lambda: _get(worker, "/readyz")[0] == 503, what="/readyz 503")
        seen.append(_get(worker, "/readyz"))

    _, code = run_worker_while(app, scenario, http=("127.0.0.1", 0))
    assert code == 0
    [(status, body)] = seen
    assert (status, body["reason"]) == (503, "stopping")


def test_readyz_says_why_while_the_schema_is_refused_and_recovers(
    create_database: Callable[[], Dsn],
):
    private = create_database()  # this test renames a table
    migrate.upgrade(private)
    app = App(private.url)

    @app.task(name="probe.noop")
    def noop() -> None: ...

    said: list[dict[str, Any]] = []

    def scenario(worker: Worker) -> None:
        wait_until(lambda: _get(worker, "/readyz")[0] == 200, what="ready")
        with psycopg.connect(private.url, autocommit=True) as admin:
            admin.execute("ALTER TABLE queued_jobs RENAME TO queued_jobs_away")
            try:

                def refused() -> dict[str, Any] | None:
                    status, body = _get(worker, "/readyz")
                    return body if status == 503 else None

                said.append(wait_until(refused, timeout=30, what="/readyz 503"))
                assert _get(worker, "/healthz")[0] == 200
            finally:
                admin.execute("ALTER TABLE queued_jobs_away RENAME TO queued_jobs")
        wait_until(lambda: _get(worker, "/readyz")[0] == 200, timeout=30, what="ready again")

    try:
        run_worker_while(app, scenario, http=("127.0.0.1", 0))
    finally:
        app.close()
    [body] = said
    assert body["reason"].startswith("schema refused (run `pgjobs migrate`")
