"""A workflow's history moves with its job (dead_letter, a redrive back to queued_jobs, the
archive) and goes when the job is deleted for good: a purge, a retention delete, `pgjobs prune`
dropping the job's archive partition."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from pgjobs import App, WorkflowContext, admin, migrate, queries, retention
from pgjobs.admin import DeadFilter
from pgjobs.maintenance.partitions import ArchivePartitions
from tests.support.factories import run_service, work
from tests.support.helpers import assert_one_home


def recorded(conn: psycopg.Connection[Any], job_id: int) -> int:
    found = conn.execute(
        "SELECT count(*) FROM pgjobs_workflow_history WHERE job_id = %s", [job_id]
    ).fetchone()
    assert found is not None
    return int(found[0])


def dead_workflow(app: App) -> int:
    @app.workflow(name="t.doomed", max_attempts=1)
    def doomed(ctx: WorkflowContext) -> None:
        ctx.step("a", lambda: 1)
        raise ValueError("no")

    job_id = app.enqueue("t.doomed", {})
    assert work(app) == 0
    return job_id


def test_the_history_stays_with_a_dead_job_and_a_purge_forgets_it(make_app, conn, dsn):
    app: App = make_app()
    job_id = dead_workflow(app)
    other = app.enqueue("t.doomed", {})
    assert work(app) == 0
    assert assert_one_home(conn, [job_id, other]) == {job_id: "dead_letter", other: "dead_letter"}
    assert recorded(conn, job_id) == 1
    assert admin.purge(dsn, DeadFilter(ids=(job_id,))) == 1
    assert recorded(conn, job_id) == 0
    assert recorded(conn, other) == 1, "only the purged job's history goes"


def test_a_redrive_keeps_the_history(make_app, conn):
    app: App = make_app()
    job_id = dead_workflow(app)
    assert app.redrive(job_id) == 1
    assert assert_one_home(conn, [job_id]) == {job_id: "queued_jobs"}
    assert recorded(conn, job_id) == 1


def test_an_archived_workflows_history_goes_with_its_row(make_app, conn):
    app: App = make_app()

    @app.workflow(name="t.fine")
    def fine(ctx: WorkflowContext) -> None:
        ctx.step("a", lambda: 1)

    job_id = app.enqueue("t.fine", {})
    assert work(app) == 0
    assert recorded(conn, job_id) == 1
    conn.execute("DELETE FROM archived_jobs WHERE id = %s", [job_id])  # as a retention delete
    assert recorded(conn, job_id) == 0


def test_the_trigger_runs_the_current_function_text(conn):
    body = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'pgjobs_workflow_forget'"
    ).fetchone()
    assert body is not None
    expected = queries.WORKFLOW_FORGET_FUNCTION.split("$fn$")[1]
    assert body[0].split() == expected.split()
    triggers = conn.execute(
        "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = 'pgjobs_workflow_forget' "
        "ORDER BY 1"
    ).fetchall()
    assert [t for (t,) in triggers] == sorted(queries.WORKFLOW_FORGET_TABLES)


def test_prune_forgets_the_histories_of_the_partitions_it_drops(create_database):
    dsn = create_database()
    migrate.upgrade(dsn)
    old = datetime.now(UTC) - timedelta(days=45)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        for job_id, finished in ((1, old), (2, datetime.now(UTC))):
            conn.execute(
                "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, "
                "attempts, max_attempts, status, created_at, finished_at) "
                "VALUES (%s, 'q', 't', '{}', 0, %s, 1, 5, 'succeeded', %s, %s)",
                [job_id, finished, finished, finished],
            )
            conn.execute(
                "INSERT INTO pgjobs_workflow_history (job_id, seq, kind, name, status) "
                "VALUES (%s, 0, 'step', 'a', 'done')",
                [job_id],
            )
        run_service(dsn, ArchivePartitions())
        report = retention.prune(dsn, timedelta(days=30))
        assert len(report.pruned) == 1
        assert recorded(conn, 1) == 0
        assert recorded(conn, 2) == 1
