"""Throttle rows: a key's row stays while its latest job can still hold the next one back (the
job is queued, or started less than a throttle ago), and goes once it cannot."""

from __future__ import annotations

from pgjobs.completer.outcomes import Outcomes
from pgjobs.maintenance.throttles import ThrottleRows
from tests.support.factories import claim, run_service, settle
from tests.support.helpers import scalar


def rows(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT unique_key FROM pgjobs_throttles ORDER BY 1")]


def test_a_throttle_row_goes_once_its_window_has_passed(make_app, dsn, conn):
    app = make_app()
    app.task(name="t.throttled", throttle=30)(lambda **_: None)
    app.enqueue("t.throttled", {}, unique_key="done-long-ago")
    app.enqueue("t.throttled", {}, unique_key="done-just-now")
    app.enqueue("t.throttled", {}, unique_key="still-queued")
    jobs = [j for j in claim(conn, limit=10) if j.unique_key != "still-queued"]
    outcomes = Outcomes("fake-worker")
    for job in jobs:
        outcomes.succeed(job, None)
    settle(conn, outcomes)
    # One of them started (and was written) a minute ago: its window of 30 s has passed.
    conn.execute(
        "UPDATE archived_jobs SET started_at = started_at - interval '1 minute'"
        " WHERE unique_key = 'done-long-ago'"
    )
    conn.execute("UPDATE pgjobs_throttles SET updated_at = updated_at - interval '1 minute'")
    service = ThrottleRows(["t.throttled"], [30.0])
    assert run_service(dsn, service).removed == 1
    assert rows(conn) == ["done-just-now", "still-queued"]
    # A task this worker does not throttle is not its business.
    assert run_service(dsn, ThrottleRows(["t.other"], [1.0])).removed == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_throttles") == 2
