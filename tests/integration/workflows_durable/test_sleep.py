"""Durable sleep: the job waits in queued_jobs without a lease, an attempt or a snooze spent, and
resumes after its wake time (the database's clock), the steps before it not run again."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta

from pgjobs import App, WorkflowContext
from tests.support.factories import db_now, row, work


def test_a_sleep_gives_the_slot_back_and_resumes_after(make_app, conn):
    app: App = make_app()
    calls: list[str] = []

    @app.workflow(name="t.nap", max_attempts=1, max_snoozes=0)
    def nap(ctx: WorkflowContext) -> str:
        ctx.step("before", lambda: calls.append("before"))
        ctx.sleep(0.3)
        ctx.step("after", lambda: calls.append("after"))
        return "rested"

    job_id = app.enqueue("t.nap", {})
    assert work(app) == 0
    assert calls == ["before", "after"]
    done = row(conn, "archived_jobs", job_id)
    assert done is not None
    assert (done["result"], done["attempts"], done["snoozes"]) == ("rested", 1, 0)
    slept = conn.execute(
        "SELECT kind, name, wake_at - recorded_at, wake_at <= %s FROM pgjobs_workflow_history "
        "WHERE job_id = %s AND seq = 1",
        [done["finished_at"], job_id],
    ).fetchone()
    assert slept == ("sleep", "sleep", timedelta(seconds=0.3), True)


def test_a_long_sleep_waits_in_the_queue_unleased(make_app, conn):
    app: App = make_app()

    @app.workflow(name="t.month")
    async def month(ctx: WorkflowContext) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the worker stops after this run
        await ctx.sleep(30 * 86400)

    job_id = app.enqueue("t.month", {})
    assert work(app, burst=False) == 0
    waiting = row(conn, "queued_jobs", job_id)
    assert waiting is not None
    assert (waiting["attempts"], waiting["snoozes"], waiting["lease_owner"]) == (0, 0, None)
    ahead = waiting["run_at"] - db_now(conn)
    assert timedelta(days=30) - timedelta(seconds=10) < ahead <= timedelta(days=30)


def test_sleep_until_a_past_time_does_not_wait(make_app, conn):
    app: App = make_app()

    @app.workflow(name="t.past")
    def past(ctx: WorkflowContext) -> str:
        ctx.sleep_until(datetime.now(UTC) - timedelta(hours=1))
        return "on"

    job_id = app.enqueue("t.past", {})
    assert work(app) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and (done["result"], done["snoozes"]) == ("on", 0)
