"""The CLI end to end, each command its own process: migrate a fresh database, enqueue, work in
burst mode, read stats; and bad input gets one error line and a non-zero exit."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from pgjobs.models import ArchivedStatus
from tests.acceptance.conftest import APP
from tests.acceptance.workload import RUNS_DDL
from tests.support.helpers import assert_one_line_error, count, run_pgjobs

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"
#: Commands that read or write the jobs, as a user would type them.
JOB_COMMANDS = (
    ("enqueue", "accept.record", "--payload", '{"key": 1}'),
    ("stats", "--json"),
    ("work", "--app", APP, "--burst"),
)


def assert_one_error_line(result: subprocess.CompletedProcess[str], *, mentions: str) -> None:
    """A failed command: one error line that mentions ``mentions``, and nothing on stdout."""
    assert_one_line_error(result.returncode, result.stderr, mentions)
    assert result.stdout == "", f"{result.args[3:]}: stdout {result.stdout!r}"


@pytest.mark.slow
def test_cli_migrate_enqueue_work_stats(create_database, subprocess_env):
    fresh = create_database()
    env = {**subprocess_env, "PGJOBS_DATABASE_URL": fresh.url}

    migrated = run_pgjobs(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "pgjobs schema created at " in migrated.stdout
    check = run_pgjobs(env, "migrate", "--check")
    assert check.returncode == 0, check.stdout + check.stderr

    with psycopg.connect(fresh.url, autocommit=True) as conn:
        conn.execute(RUNS_DDL)

        enqueued = run_pgjobs(env, "enqueue", "accept.record", "--payload", '{"key": 7}')
        assert enqueued.returncode == 0, enqueued.stderr
        job_id = int(enqueued.stdout.strip())  # the id, and nothing else
        queued = conn.execute("SELECT task, payload FROM queued_jobs WHERE id = %s", [job_id])
        assert queued.fetchall() == [("accept.record", {"key": 7})]

        worked = run_pgjobs(env, "work", "--app", APP, "--burst", "--poll-interval", "0.1")
        assert worked.returncode == 0, worked.stderr
        archived = conn.execute(
            "SELECT status, result, attempts FROM archived_jobs WHERE id = %s", [job_id]
        ).fetchall()
        assert archived == [(ArchivedStatus.SUCCEEDED, 7, 1)]
        assert count(conn, "queued_jobs") == 0
        ran = conn.execute("SELECT key, phase FROM runs ORDER BY at").fetchall()
        assert ran == [(7, "start"), (7, "done")]

    stats = run_pgjobs(env, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    by_queue = {row["queue"]: row for row in json.loads(stats.stdout)}
    assert set(by_queue) == {"default"}
    default = by_queue["default"]
    assert default["finished_last_hour"] == 1
    assert (default["ready"], default["scheduled"], default["running"], default["dead"]) == (
        0,
        0,
        0,
        0,
    )


@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_nonzero(create_database, subprocess_env, conn):
    env = subprocess_env

    bad_json = run_pgjobs(env, "enqueue", "accept.record", "--payload", '{"key": ')
    assert_one_error_line(bad_json, mentions="not valid JSON")

    for args in (*JOB_COMMANDS, ("migrate",)):
        unreachable = run_pgjobs(env, *args, "--dsn", UNREACHABLE)
        assert_one_error_line(unreachable, mentions="cannot reach the database")

    unmigrated = create_database()
    env_unmigrated = {**env, "PGJOBS_DATABASE_URL": unmigrated.url}
    for args in JOB_COMMANDS:
        missing = run_pgjobs(env_unmigrated, *args)
        assert_one_error_line(missing, mentions="pgjobs migrate")

    # None of the bad commands wrote anything to the test database.
    assert count(conn, "queued_jobs") == 0
