"""Pausing a periodic schedule: a paused schedule enqueues nothing, a declaration keeps it paused,
and when it is resumed its catch_up rule decides what runs of the occurrences it missed;
`pgjobs schedule pause/resume` and ``App.pause_schedule`` / ``resume_schedule``."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, schedules
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance.scheduler import Scheduled
from tests.integration.maintenance.test_periodic import (
    hourly_app,
    jobs,
    move_back,
    no_schedules,
    schedule_row,
    scheduler,
)
from tests.support.factories import run_service
from tests.support.helpers import assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")
__all__ = ["no_schedules"]  # its autouse fixture empties pgjobs_schedules around each test


def test_a_paused_schedule_enqueues_nothing_until_resumed(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = hourly_app(make_app, catch_up="last")
    run_service(dsn, scheduler(app))  # declares it
    change = app.pause_schedule("reports.hourly", reason="warehouse migration")
    assert change.changed and change.schedule.paused
    assert change.schedule.paused_by is not None
    assert change.schedule.paused_by.endswith(": warehouse migration")
    # Three hours missed while paused: nothing is enqueued, and next_run_at stays put.
    due_at = move_back(conn, "reports.hourly", timedelta(hours=3))
    assert run_service(dsn, scheduler(app)) == Scheduled(0, 0)
    # A fresh scheduler declares it again: still paused.
    assert run_service(dsn, scheduler(app)) == Scheduled(0, 0)
    assert jobs(conn) == []
    row = schedule_row(conn, "reports.hourly")
    assert row["next_run_at"] == due_at and row["paused_at"] is not None
    # Pausing again changes nothing, and keeps who paused it.
    again = app.pause_schedule("reports.hourly", reason="other")
    assert not again.changed and again.schedule.paused_by == change.schedule.paused_by

    resumed = app.resume_schedule("reports.hourly")
    assert resumed.changed and not resumed.schedule.paused
    assert resumed.schedule.paused_by is None
    # catch_up="last": the latest missed occurrence runs, the older ones are skipped.
    assert run_service(dsn, scheduler(app)) == Scheduled(1, 2)
    ((task, run_at, _),) = jobs(conn)
    assert task == "reports.build" and run_at == due_at + timedelta(hours=2)
    assert not app.resume_schedule("reports.hourly").changed


def test_resuming_a_skip_schedule_runs_nothing_it_missed(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = hourly_app(make_app, catch_up="skip")
    run_service(dsn, scheduler(app))
    schedules.pause(dsn, "reports.hourly")
    move_back(conn, "reports.hourly", timedelta(hours=2))
    assert run_service(dsn, scheduler(app)) == Scheduled(0, 0)
    schedules.resume(dsn, "reports.hourly")
    assert run_service(dsn, scheduler(app)) == Scheduled(0, 2)
    assert jobs(conn) == []
    assert schedule_row(conn, "reports.hourly")["next_run_at"] > datetime.now().astimezone()


def test_unknown_schedules_are_refused(make_app: Callable[..., App], dsn: Dsn) -> None:
    app = make_app()
    with pytest.raises(ConfigurationError, match="no schedule named 'nope'"):
        app.pause_schedule("nope")
    with pytest.raises(ConfigurationError, match="no schedule named 'nope'"):
        schedules.resume(dsn, "nope")
    with pytest.raises(ConfigurationError, match="schedule name"):
        schedules.pause(dsn, "")


def test_schedule_pause_and_resume_commands(
    capsys: pytest.CaptureFixture[str],
    make_app: Callable[..., App],
    conn: psycopg.Connection[Any],
    dsn: Dsn,
) -> None:
    app = hourly_app(make_app)
    run_service(dsn, scheduler(app))

    code, out, err = run(
        capsys, "schedule", "pause", "reports.hourly", "--reason", "freeze", "--dsn", dsn.url
    )
    assert (code, err) == (0, ""), err
    assert out.startswith("schedule reports.hourly paused (since ") and ": freeze)" in out
    code, out, _ = run(capsys, "schedule", "pause", "reports.hourly", "--dsn", dsn.url)
    assert code == 0 and "was already paused" in out

    code, out, _ = run(capsys, "schedule", "--dsn", dsn.url)
    assert code == 0 and "paused" in out and "freeze" in out
    code, out, _ = run(capsys, "schedule", "--json", "--dsn", dsn.url)
    (listed,) = json.loads(out)
    assert listed["paused_at"] is not None and listed["paused_by"].endswith(": freeze")

    code, out, _ = run(capsys, "schedule", "resume", "reports.hourly", "--json", "--dsn", dsn.url)
    answer = json.loads(out)
    assert code == 0 and answer["changed"] is True and answer["schedule"]["paused_at"] is None
    code, out, _ = run(capsys, "schedule", "resume", "reports.hourly", "--dsn", dsn.url)
    assert code == 0 and out.strip() == "schedule reports.hourly was not paused"
    assert schedule_row(conn, "reports.hourly")["paused_at"] is None

    for verb in ("pause", "resume"):
        code, _, err = run(capsys, "schedule", verb, "nope", "--dsn", dsn.url)
        assert code == 2
        assert_one_line_error(code, err, "no schedule named 'nope'")
