"""A job's snoozes and progress in `pgjobs job show` (text and ``--json``), kept when the job
moves to the archive."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest

from pgjobs import App
from tests.support.admin_factories import claim_one, succeed
from tests.support.helpers import run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

PROGRESS = {"done": 30, "total": 120, "message": "resizing", "at": "2031-01-01T02:00:00.5+02:00"}


def _reported(conn: psycopg.Connection[Any], app: App, progress: Any = PROGRESS) -> int:
    job_id = app.enqueue("images.resize", {"n": 1})
    conn.execute(
        "UPDATE queued_jobs SET snoozes = 3, progress = %s WHERE id = %s",
        [json.dumps(progress), job_id],
    )
    return job_id


def test_job_show_prints_snoozes_and_progress(make_app, conn, dsn, capsys):
    app = make_app(check_task_names=False)
    job_id = _reported(conn, app)
    code, out, _ = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert code == 0
    lines = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in out.splitlines()[1:]}
    assert lines["snoozes"] == "3"
    # Its time reads as every other time of the job: in UTC, to the second.
    assert lines["progress"] == "30 of 120 (25%): resizing, at 2031-01-01 00:00:00 UTC"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", lines["created"])
    assert not re.search(r"\d\dT\d\d:", out), out
    # Kept by the move into the archive; shown in --json as stored.
    succeed(conn, claim_one(conn, job_id))
    code, out, _ = run(capsys, "job", "show", str(job_id), "--json", "--dsn", dsn.url)
    shown = json.loads(out)
    assert (shown["table"], shown["snoozes"], shown["progress"]) == ("archived_jobs", 3, PROGRESS)


@pytest.mark.parametrize(
    "at", ["yesterday\x1b[2J", "2031-01-01T00:00:00", "0001-01-01T00:00:00+01:00", 17]
)
def test_a_progress_time_pgjobs_did_not_write_is_shown_as_it_is(make_app, conn, dsn, capsys, at):
    # Not a time with its offset (a row written by SQL or another program): shown, escaped.
    job_id = _reported(conn, make_app(check_task_names=False), {**PROGRESS, "at": at})
    code, out, err = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert code == 0, err
    shown = {"yesterday\x1b[2J": "yesterday\\x1b[2J"}.get(at, str(at))
    assert f"resizing, at {shown}\n" in out


def test_job_show_leaves_out_what_a_job_does_not_have(make_app, dsn, capsys):
    job_id = make_app(check_task_names=False).enqueue("images.resize", {"n": 1})
    code, out, _ = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert code == 0
    assert "snoozes" not in out and "progress" not in out
