"""The `pgjobs` command end to end, in process: `pgjobs.cli.main([...])` returns the exit code,
and every error is one line on stderr starting with "pgjobs: error:"."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgjobs import migrate
from tests.support.factories import counts, db_now, row
from tests.support.helpers import assert_one_line_error, run

APP = "tests.integration.cli_app:app"
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"
NOTHING = {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}


pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


# -- migrate ---------------------------------------------------------------------------------


def test_migrate_current_check_and_downgrade(capsys, create_database):
    fresh = create_database()
    head = migrate.head()

    code, out, _ = run(capsys, "migrate", "--check", "--dsn", fresh.url)
    assert code == 1
    assert "current: none" in out and f"head: {head}" in out

    code, out, _ = run(capsys, "migrate", "--revision", "0003", "--dsn", fresh.url)
    assert (code, out.split(" in ")[0]) == (0, "pgjobs schema created at 0003")
    code, out, _ = run(capsys, "migrate", "--dsn", fresh.url)
    assert (code, out.split(" in ")[0]) == (0, f"pgjobs schema upgraded 0003 -> {head}")
    code, out, _ = run(capsys, "migrate", "--dsn", fresh.url)
    assert code == 0
    assert out.startswith(f"pgjobs schema already at head {head} in ") and "nothing to do" in out

    code, out, _ = run(capsys, "migrate", "--current", "--dsn", fresh.url)
    assert (code, out.split()) == (0, ["current:", head, "head:", head])
    code, _, _ = run(capsys, "migrate", "--check", "--dsn", fresh.url)
    assert code == 0

    code, out, _ = run(capsys, "migrate", "--downgrade", "base", "--dsn", fresh.url)
    assert (code, out.split(" in ")[0]) == (0, f"pgjobs schema removed (was at {head})")
    assert migrate.current(fresh) is None


def test_migrate_sql_needs_no_database(capsys):
    code, out, err = run(capsys, "migrate", "--sql", "--dsn", UNREACHABLE)
    assert code == 0, err
    assert "CREATE TABLE queued_jobs" in out


def test_migrate_reads_the_dsn_from_the_environment(capsys, create_database, monkeypatch):
    fresh = create_database()
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)  # PGJOBS_DATABASE_URL takes precedence
    monkeypatch.setenv("PGJOBS_DATABASE_URL", fresh.url.replace("postgresql://", "postgres://"))
    code, _, err = run(capsys, "migrate")
    assert code == 0, err
    assert migrate.current(fresh) == migrate.head()


# -- enqueue ---------------------------------------------------------------------------------


def test_enqueue_prints_the_id_and_applies_every_option(capsys, dsn, conn):
    code, out, err = run(
        capsys,
        "enqueue",
        "cli.add",
        "--payload",
        '{"a": 1, "b": 2}',
        "--queue",
        "math",
        "--priority",
        "7",
        "--delay",
        "3600",
        "--max-attempts",
        "2",
        "--expires-in",
        "7200",
        "--idempotency-key",
        "sum-1",
        "--dsn",
        dsn.url,
    )
    assert code == 0, err
    job_id = int(out.strip())
    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None
    assert (queued["task"], queued["payload"], queued["queue"]) == (
        "cli.add",
        {"a": 1, "b": 2},
        "math",
    )
    assert (queued["priority"], queued["max_attempts"]) == (7, 2)
    assert queued["idempotency_key"] == "sum-1"
    now = db_now(conn)
    assert timedelta(minutes=50) < queued["run_at"] - now <= timedelta(hours=1)
    assert timedelta(minutes=110) < queued["expires_at"] - now <= timedelta(hours=2)

    code, again, _ = run(
        capsys, "enqueue", "cli.add", "--idempotency-key", "sum-1", "--dsn", dsn.url
    )
    assert (code, int(again)) == (0, job_id)
    assert counts(conn)["queued_jobs"] == 1


def test_enqueue_run_at_with_timezone_and_the_sqlalchemy_dsn_form(capsys, dsn, conn):
    code, out, err = run(
        capsys,
        "enqueue",
        "cli.add",
        "--run-at",
        "2030-01-02T03:04:05+02:00",
        "--dsn",
        dsn.sqlalchemy_url,
    )
    assert code == 0, err
    queued = row(conn, "queued_jobs", int(out))
    assert queued is not None
    assert queued["run_at"] == datetime(2030, 1, 2, 1, 4, 5, tzinfo=UTC)
    assert queued["payload"] == {}


def test_enqueue_payload_from_a_file(capsys, dsn, conn, tmp_path):
    payload = tmp_path / "payload.json"
    payload.write_text('{"a": 40, "b": 2}')
    code, out, err = run(capsys, "enqueue", "cli.add", "-p", f"@{payload}", "--dsn", dsn.url)
    assert code == 0, err
    assert row(conn, "queued_jobs", int(out))["payload"] == {"a": 40, "b": 2}  # type: ignore[index]


def test_enqueue_with_app_uses_the_tasks_queue_and_refuses_unknown_names(capsys, dsn, conn):
    code, out, err = run(
        capsys, "enqueue", "cli.shout", "-p", '{"text": "hi"}', "--app", APP, "--dsn", dsn.url
    )
    assert code == 0, err
    assert row(conn, "queued_jobs", int(out))["queue"] == "loud"  # type: ignore[index]

    code, _, err = run(capsys, "enqueue", "cli.shout", "--app", APP, "--dsn", dsn.url)
    assert_one_line_error(code, err, "cli.shout", "missing a required argument: 'text'")
    assert code == 2

    code, _, err = run(capsys, "enqueue", "cli.nope", "--app", APP, "--dsn", dsn.url)
    assert_one_line_error(code, err, "cli.nope")
    assert "#" not in err, "one job: no position in the error"
    assert counts(conn)["queued_jobs"] == 1


BAD_ENQUEUE = [
    pytest.param(["--payload", '{"a": 1'], ["not valid JSON"], id="malformed-json"),
    pytest.param(["--payload", "[1, 2]"], ["JSON object", "list"], id="non-object"),
    pytest.param(["--payload", '"text"'], ["JSON object", "str"], id="string-payload"),
    pytest.param(["--payload", "@/nonexistent/payload.json"], ["cannot read"], id="no-file"),
    pytest.param(["--delay", "-1"], ["--delay"], id="negative-delay"),
    pytest.param(["--run-at", "2030-01-01T00:00:00"], ["no timezone"], id="naive-run-at"),
    pytest.param(["--run-at", "tomorrow"], ["ISO 8601"], id="unparseable-run-at"),
    pytest.param(
        ["--run-at", "2030-01-01T00:00:00+00:00", "--delay", "5"], ["not both"], id="both"
    ),
    pytest.param(["--priority", "40000"], ["--priority"], id="priority-out-of-range"),
    pytest.param(["--max-attempts", "0"], ["--max-attempts"], id="max-attempts-0"),
    pytest.param(["--queue", ""], ["queue"], id="empty-queue"),
    pytest.param(["--bogus"], ["--bogus"], id="unknown-option"),
]


@pytest.mark.parametrize(("args", "words"), BAD_ENQUEUE)
def test_enqueue_bad_input_is_one_line_and_writes_nothing(capsys, dsn, conn, args, words):
    code, out, err = run(capsys, "enqueue", "cli.add", *args, "--dsn", dsn.url)
    assert_one_line_error(code, err, *words)
    assert "job #" not in err, "one job: no position in the error"
    assert out == ""
    assert counts(conn) == NOTHING


@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "cli.add", "--dsn", UNREACHABLE],
        ["stats", "--dsn", UNREACHABLE],
        ["migrate", "--dsn", UNREACHABLE],
        ["migrate", "--current", "--dsn", UNREACHABLE],
        ["work", "--app", APP, "--burst", "--dsn", UNREACHABLE],
    ],
    ids=["enqueue", "stats", "migrate", "migrate-current", "work"],
)
def test_unreachable_database_is_one_line(capsys, conn, argv):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, "cannot reach the database", "127.0.0.1:1")
    assert counts(conn) == NOTHING


def test_password_never_appears_in_errors(capsys):
    code, _, err = run(capsys, "stats", "--dsn", "postgresql://postgres:hunter2@127.0.0.1:1/x")
    assert_one_line_error(code, err, "cannot reach the database")
    assert "hunter2" not in err


def test_bad_dsn_scheme_is_one_line(capsys):
    code, _, err = run(capsys, "stats", "--dsn", "mysql://root@127.0.0.1/x")
    assert_one_line_error(code, err, "--dsn", "postgresql://")


@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "cli.add"],
        ["stats"],
        ["work", "--app", APP, "--burst"],
    ],
    ids=["enqueue", "stats", "work"],
)
def test_missing_schema_says_run_pgjobs_migrate(capsys, create_database, argv):
    fresh = create_database()
    code, _, err = run(capsys, *argv, "--dsn", fresh.url)
    assert_one_line_error(code, err, "pgjobs migrate")
    with psycopg.connect(fresh.url) as c:
        found = c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert found == (0,), "a failed command must not create tables"


# -- stats -----------------------------------------------------------------------------------


def _fill_queues(capsys, dsn) -> None:
    for args in (
        ["cli.shout", "-p", '{"text": "a"}'],
        ["cli.shout", "-p", '{"text": "b"}'],
        ["cli.add", "-p", '{"a": 1, "b": 2}', "--queue", "later", "--delay", "3600"],
    ):
        code, _, err = run(capsys, "enqueue", *args, "--app", APP, "--dsn", dsn.url)
        assert code == 0, err


def test_stats_table(capsys, dsn):
    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    assert "no jobs yet" in out

    _fill_queues(capsys, dsn)
    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    assert "pgjobs queues" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")}
    assert "loud" in lines and "later" in lines
    assert lines["loud"].split("│")[2].strip() == "2", "two ready jobs in 'loud'"
    assert lines["later"].split("│")[3].strip() == "1", "one scheduled job in 'later'"


def test_stats_json(capsys, dsn):
    _fill_queues(capsys, dsn)
    code, out, err = run(capsys, "stats", "--json", "--dsn", dsn.url)
    assert code == 0, err
    stats = {entry["queue"]: entry for entry in json.loads(out)}
    assert set(stats) == {"loud", "later"}
    assert stats["loud"]["ready"] == 2 and stats["loud"]["scheduled"] == 0
    assert stats["later"]["ready"] == 0 and stats["later"]["scheduled"] == 1
    assert stats["later"]["oldest_ready_age"] is None
    assert stats["loud"]["oldest_ready_age"] >= 0
    assert {"running", "dead", "finished_last_hour", "failed_last_hour"} <= set(stats["loud"])


# -- work ------------------------------------------------------------------------------------


def test_work_burst_runs_the_jobs_then_exits_0(capsys, dsn, conn):
    ids = []
    for args in (["cli.add", "-p", '{"a": 2, "b": 3}'], ["cli.shout", "-p", '{"text": "hi"}']):
        code, out, err = run(capsys, "enqueue", *args, "--app", APP, "--dsn", dsn.url)
        assert code == 0, err
        ids.append(int(out))

    code, _, err = run(
        capsys,
        "work",
        "--app",
        APP,
        "--burst",
        "--concurrency",
        "2",
        "--poll-interval",
        "0.05",
        "--no-maintenance",
        "--dsn",
        dsn.url,
    )
    assert code == 0, err
    results = dict(conn.execute("SELECT id, result FROM archived_jobs").fetchall())
    assert results == {ids[0]: 5, ids[1]: "HI"}
    assert counts(conn)["queued_jobs"] == 0

    code, out, _ = run(capsys, "stats", "--json", "--dsn", dsn.url)
    finished = {e["queue"]: e["finished_last_hour"] for e in json.loads(out)}
    assert finished == {"default": 1, "loud": 1}


@pytest.mark.parametrize(
    ("app_ref", "words"),
    [
        ("tests.integration.no_such_module:app", ["cannot import"]),
        ("tests.integration.cli_app:nothing", ["no pgjobs.App"]),
    ],
)
def test_work_with_a_bad_app_reference(capsys, dsn, app_ref, words):
    code, _, err = run(capsys, "work", "--app", app_ref, "--burst", "--dsn", dsn.url)
    assert_one_line_error(code, err, *words)


def test_unknown_command_is_one_line(capsys):
    code, _, err = run(capsys, "frobnicate")
    assert_one_line_error(code, err, "frobnicate")
