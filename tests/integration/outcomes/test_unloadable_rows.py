"""A row pgjobs did not write (SQL, a dump, an older release) with a value Python cannot hold
costs only itself: the claim that takes it buries that one job saying why, every other job of the
batch runs, and every listing shows the row as it is."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgjobs import App, admin, browse
from pgjobs.db.dsn import Dsn
from pgjobs.models import DeadReason, JobStatus, Unloadable
from pgjobs.testing import drain
from tests.support.factories import insert_dead_raw, insert_raw, work
from tests.support.helpers import assert_one_home, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

# (column, value): values PostgreSQL holds in a timestamptz that Python's datetime cannot, in
# columns a ready job may hold them in.
UNLOADABLE = [
    ("created_at", "infinity"),
    ("created_at", "-infinity"),
    ("created_at", "10000-01-01 00:00:00+00"),
    ("expires_at", "infinity"),
    ("expires_at", "10000-01-01 00:00:00+00"),
    ("run_at", "-infinity"),
]


def _dead(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, str]:
    found = conn.execute(
        "SELECT reason, last_error FROM dead_letter WHERE id = %s", [job_id]
    ).fetchone()
    assert found is not None
    return found[0], found[1]


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
@pytest.mark.parametrize(("column", "value"), UNLOADABLE)
def test_a_row_with_a_time_python_cannot_hold_costs_only_itself(
    make_app, conn, column, value, limited
):
    app: App = make_app()
    runs: list[int] = []

    # A task with a limit is claimed by the pipelined statements, the others on the libpq path.
    @app.task(name="t.ok", concurrency=8 if limited else None)
    def ok(n: int) -> None:
        runs.append(n)

    ids = [app.enqueue("t.ok", {"n": n}) for n in range(10)]
    bad = insert_raw(conn, "t.ok", '{"n": -1}', **{column: value}, priority=5)
    ids += [app.enqueue("t.ok", {"n": n}) for n in range(10, 20)]

    assert work(app, concurrency=4) == 0

    assert sorted(runs) == list(range(20))
    where = assert_one_home(conn, [bad, *ids])
    assert where == {bad: "dead_letter", **dict.fromkeys(ids, "archived_jobs")}
    reason, error = _dead(conn, bad)
    assert reason == DeadReason.INVALID_PAYLOAD
    assert f"{column} = '{value}'" in error and "not written by pgjobs" in error


def test_listings_show_a_row_python_cannot_hold_as_it_is(dsn: Dsn, conn, capsys):
    # Written by SQL: times Python cannot hold, a payload that is not a JSON object.
    bad = insert_dead_raw(
        conn, created_at="infinity", run_at="10000-01-01", payload='["not", "an", "object"]'
    )
    good = insert_dead_raw(conn, task="t.fine")

    listed = {job.id: job for job in admin.dead_jobs(dsn)}
    assert set(listed) == {bad, good}
    created = listed[bad].created_at
    assert isinstance(created, Unloadable) and str(created) == "infinity"
    assert str(listed[bad].run_at) == "10000-01-01 00:00:00+00"
    assert listed[bad].payload == ["not", "an", "object"]
    assert not isinstance(listed[good].created_at, Unloadable)
    assert str(admin.dead_job(dsn, bad).created_at) == "infinity"
    history = admin.job(dsn, bad)
    assert history.status is JobStatus.DEAD and str(history.created_at) == "infinity"
    assert [job.id for job in browse.jobs_by_id(dsn, [bad, good])] == [bad, good]

    code, out, err = run(capsys, "dead", "list", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert str(bad) in out and str(good) in out
    code, out, err = run(capsys, "dead", "show", str(bad), "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert "created      infinity" in out
    code, out, err = run(capsys, "dead", "list", "--json", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert {job["id"]: job["created_at"] for job in json.loads(out)}[bad] == "infinity"
    code, out, err = run(capsys, "job", "show", str(bad), "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert "created      infinity" in out and "run at       10000-01-01 00:00:00+00" in out
    code, out, err = run(capsys, "job", "show", str(bad), "--json", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["created_at"] == "infinity" and shown["payload"] == ["not", "an", "object"]


def test_stats_and_doctor_read_queued_rows_with_infinite_times(make_app, dsn: Dsn, conn, capsys):
    app: App = make_app()
    insert_raw(conn, "t.any", run_at="-infinity")
    leased = insert_raw(conn, "t.any", lease_owner="gone", attempts=1)
    conn.execute("UPDATE queued_jobs SET lease_expires_at = 'infinity' WHERE id = %s", [leased])
    app.enqueue("t.any", {})

    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert (code, err) == (0, ""), err
    assert "default" in out
    assert str(admin.job(dsn, leased).lease_expires_at) == "infinity"
    # The doctor reads the leases of workers that are gone: an infinite one has no expiry.
    _, out, err = run(capsys, "doctor", "--dsn", dsn.url)
    assert "infinite" not in out + err


def test_drain_records_the_job_it_could_not_load_as_dead(make_app, conn):
    app: App = make_app()

    @app.task(name="t.ok")
    def ok() -> None:
        pass

    bad = insert_raw(conn, "t.ok", created_at="infinity")
    good = app.enqueue("t.ok", {})

    ran = drain(app)

    assert ran.succeeded == [good]
    assert [(dead.id, dead.task, dead.reason) for dead in ran.dead] == [
        (bad, "t.ok", DeadReason.INVALID_PAYLOAD)
    ]
