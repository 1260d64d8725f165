"""Dependencies on the command line: `pgjobs enqueue --after ID` (repeatable), `pgjobs job show`
listing a job's dependencies, dependents and what it still waits for (and in --json), `pgjobs
stats` counting waiting jobs apart; bad ids are one line, exit 2, and write nothing."""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import assert_one_line_error, count, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def enqueue(capsys, dsn, *extra: str) -> int:
    code, out, err = run(capsys, "enqueue", "t", "--queue", "q", *extra, "--dsn", dsn.url)
    assert code == 0, err
    return int(out.strip())


def test_enqueue_after_makes_the_job_wait_and_show_says_for_what(capsys, dsn, conn):
    first = enqueue(capsys, dsn)
    second = enqueue(capsys, dsn)
    third = enqueue(capsys, dsn, "--after", str(first), "--after", str(second))
    assert conn.execute(
        "SELECT waiting_on FROM pgjobs_waiting WHERE job_id = %s", [third]
    ).fetchone() == (2,)

    code, out, err = run(capsys, "job", "show", str(third), "--dsn", dsn.url)
    assert code == 0, err
    assert f"job {third}: waiting (queued_jobs)" in out
    assert f"after        {first} (ready), {second} (ready)" in out
    assert "waiting for  2 of 2 dependencies" in out

    code, out, err = run(capsys, "job", "show", str(first), "--dsn", dsn.url)
    assert f"dependents   {third} (waiting)" in out

    code, out, err = run(capsys, "job", "show", str(third), "--json", "--dsn", dsn.url)
    shown = json.loads(out)
    assert shown["status"] == "waiting" and shown["waiting_on"] == 2
    assert shown["after"] == [
        {"id": first, "status": "ready", "name": None, "result": None, "result_omitted": False},
        {"id": second, "status": "ready", "name": None, "result": None, "result_omitted": False},
    ]
    assert shown["dependents"] == []

    code, out, err = run(capsys, "stats", "--json", "--dsn", dsn.url)
    (q,) = json.loads(out)
    assert (q["ready"], q["scheduled"], q["waiting"]) == (2, 0, 1)


@pytest.mark.parametrize(
    ("after", "words"),
    [
        ("0", ["0"]),
        ("abc", ["--after"]),
        ("999999", ["no job 999999 to wait for"]),
    ],
)
def test_a_bad_after_is_one_line_exit_2_and_writes_nothing(capsys, dsn, conn, after, words):
    code, _, err = run(capsys, "enqueue", "t", "--after", after, "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, *words)
    assert count(conn, "queued_jobs") == 0


def test_enqueue_after_a_cancelled_job_is_refused(capsys, dsn, conn):
    first = enqueue(capsys, dsn)
    code, _, err = run(capsys, "cancel", str(first), "--dsn", dsn.url)
    assert code == 0, err
    code, _, err = run(capsys, "enqueue", "t", "--after", str(first), "--dsn", dsn.url)
    assert_one_line_error(code, err, f"job {first} already ended cancelled")
    assert code == 2
