"""`pgjobs doctor` against the real PostgreSQL: each check finds what it looks for (a missing
schema, autovacuum off, a transaction holding vacuum back, stale workers, orphaned leases, missing
archive partitions, rows in the DEFAULT partition, a connection budget too small), prints one line
with its fix, and the exit code follows the worst verdict."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgjobs import App, JobSpec, archive, doctor, migrate
from pgjobs.db.dsn import Dsn
from pgjobs.doctor import connections as doctor_connections
from tests.support.factories import claim
from tests.support.helpers import assert_one_line_error, pgjobs_process, run, scalar, wait_until
from tests.support.urls import url_with

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

CHECKS = [
    "connection",
    "schema",
    "autovacuum",
    "queued_jobs_vacuum",
    "oldest_transaction",
    "notify_queue",
    "pooler",
    "connection_budget",
    "archive_partitions",
    "archive_default_partition",
    "archive_retention",
    "stale_workers",
    "orphaned_leases",
]


def checks_of(
    capsys: pytest.CaptureFixture[str], url: str, *args: str
) -> tuple[int, dict[str, Any]]:
    """`pgjobs doctor --json` in process: (exit code, checks by name)."""
    code, out, err = run(capsys, "doctor", "--dsn", url, "--json", *args)
    assert err == "", err
    report = json.loads(out)
    return code, {check["name"]: check for check in report["checks"]}


def line_of(out: str, name: str) -> str:
    """The line of check ``name`` in `pgjobs doctor`'s output."""
    found = [line for line in out.splitlines() if line.split()[1:2] == [name]]
    assert len(found) == 1, out
    return found[0]


def test_a_fresh_migrated_database_passes_and_says_autovacuum_is_off(capsys, dsn, conn):
    code, out, err = run(capsys, "doctor", "--dsn", dsn.url)
    assert err == ""
    assert code == 0, out
    assert line_of(out, "schema").startswith("PASS"), out
    assert f"at revision {migrate.head()}" in line_of(out, "schema")
    autovacuum = line_of(out, "autovacuum")
    if scalar(conn, "SHOW autovacuum") == "off":
        assert autovacuum.startswith("WARN"), out
        assert "autovacuum is off on this server" in autovacuum
        assert "queued_jobs" in autovacuum  # why it matters
        fix = out.splitlines()[out.splitlines().index(autovacuum) + 1]
        assert "fix: ALTER SYSTEM SET autovacuum = on" in fix
        # Warnings do not fail the run; the last line counts them.
        assert out.splitlines()[-1].startswith("no check failed, "), out
        assert out.splitlines()[-1].endswith(" warning(s)"), out
    else:
        assert autovacuum.startswith("PASS"), out
    for name in ("pooler", "archive_partitions", "stale_workers", "orphaned_leases"):
        assert line_of(out, name).startswith("PASS"), out
    assert "direct connection" in line_of(out, "pooler")


def test_an_unmigrated_database_fails_the_schema_check(capsys, create_database):
    empty = create_database()
    code, out, _ = run(capsys, "doctor", "--dsn", empty.url)
    assert code == 1, out
    schema = line_of(out, "schema")
    assert schema.startswith("FAIL") and "tables are missing" in schema, out
    assert "fix: run `pgjobs migrate`" in out
    for name in ("queued_jobs_vacuum", "archive_partitions", "stale_workers", "orphaned_leases"):
        assert line_of(out, name).startswith("SKIP"), out
    assert out.splitlines()[-1].startswith("1 check(s) failed")


def test_a_database_behind_head_fails_the_schema_check(capsys, create_database):
    behind = create_database()
    migrate.upgrade(behind, "0003")
    code, checks = checks_of(capsys, behind.url)
    assert code == 1
    assert checks["schema"]["status"] == "fail"
    assert checks["schema"]["details"] == {"revision": "0003", "head": migrate.head()}
    assert checks["schema"]["fix"] == "run `pgjobs migrate`"


def test_the_json_shape(capsys, dsn):
    code, out, _ = run(capsys, "doctor", "--dsn", dsn.url, "--json")
    report = json.loads(out)
    assert set(report) == {"checks", "summary"}
    assert [check["name"] for check in report["checks"]] == CHECKS
    for check in report["checks"]:
        assert set(check) == {"name", "status", "message", "fix", "details"}, check
        assert check["status"] in ("pass", "warn", "fail", "skip")
        assert isinstance(check["message"], str) and check["message"]
        assert isinstance(check["details"], dict)
        assert (check["fix"] is None) == (check["status"] in ("pass", "skip")), check
    summary = report["summary"]
    assert set(summary) == {"status", "passed", "warnings", "failed", "skipped"}
    assert summary["passed"] + summary["warnings"] + summary["failed"] + summary["skipped"] == len(
        CHECKS
    )
    assert code == (1 if summary["failed"] else 0)
    pooler = next(c for c in report["checks"] if c["name"] == "pooler")
    assert pooler["status"] == "pass", pooler
    assert pooler["details"]["same_session"] is True
    assert pooler["details"]["listen_round_trip_seconds"] < 2


def test_an_open_transaction_holding_back_vacuum_is_named(dsn):
    with psycopg.connect(dsn.url, application_name="billing-report") as holder:
        # A transaction id of its own (it wrote nothing yet, but txid_current assigns one).
        pid = scalar(holder, "SELECT pg_backend_pid()")
        scalar(holder, "SELECT txid_current()")
        passed = doctor.diagnose(dsn).checks[4]
        report = doctor.diagnose(dsn, thresholds=doctor.Thresholds(long_transaction=0))
        holder.rollback()
    assert passed.name == "oldest_transaction"
    assert passed.status is doctor.Status.PASS  # open for less than 5 minutes
    assert f"pid {pid}" in passed.message
    check = next(c for c in report.checks if c.name == "oldest_transaction")
    assert check.status is doctor.Status.WARN, check
    assert f"pid {pid} (idle in transaction, application 'billing-report'" in check.message
    assert "vacuum cannot remove" in check.message
    assert check.fix is not None and f"pg_terminate_backend({pid})" in check.fix
    assert check.details["pid"] == pid
    assert check.details["state"] == "idle in transaction"
    assert check.details["application_name"] == "billing-report"
    assert check.details["seconds"] >= 0


def test_a_stale_worker_and_its_orphaned_lease_are_reported(capsys, dsn, conn):
    conn.execute(
        "INSERT INTO pgjobs_workers (id, host, pid, queues, concurrency, started_at, last_seen_at)"
        " VALUES ('old-host:4242:dead', 'old-host', 4242, '{default}', 4,"
        " now() - interval '2 hours', now() - interval '10 minutes')"
    )
    with App(dsn.url) as app:
        app.enqueue("anything", {})
    (job,) = claim(conn, owner="old-host:4242:dead", lease=600)
    code, out, _ = run(capsys, "doctor", "--dsn", dsn.url)
    assert code == 0, out
    stale = line_of(out, "stale_workers")
    assert stale.startswith("WARN") and "1 worker row(s) without a heartbeat" in stale, out
    assert "old-host:4242:dead (10 min ago)" in stale
    orphaned = line_of(out, "orphaned_leases")
    assert orphaned.startswith("WARN"), out
    assert "1 running job(s) leased to 1 worker(s) that are not live" in orphaned
    assert "leases expire within" in orphaned
    _, checks = checks_of(capsys, dsn.url)
    assert checks["stale_workers"]["details"]["workers"][0]["pid"] == 4242
    assert checks["orphaned_leases"]["details"]["jobs"] == 1
    assert job.lease_owner == "old-host:4242:dead"


def test_a_live_worker_is_neither_stale_nor_orphaned(capsys, dsn, conn):
    conn.execute(
        "INSERT INTO pgjobs_workers (id, host, pid, queues, concurrency, started_at)"
        " VALUES ('live-host:1:w', 'live-host', 1, '{default}', 4, now())"
    )
    with App(dsn.url) as app:
        app.enqueue("anything", {})
    claim(conn, owner="live-host:1:w")
    _, checks = checks_of(capsys, dsn.url)
    assert checks["stale_workers"]["status"] == "pass"
    assert checks["orphaned_leases"]["status"] == "pass"
    assert checks["connection_budget"]["details"]["live_workers"] == 1
    assert checks["connection_budget"]["details"]["live_worker_connections"] == 5


def test_dead_rows_in_queued_jobs_warn(capsys, create_database):
    private = create_database()
    migrate.upgrade(private)
    with App(private.url) as app, psycopg.connect(private.url, autocommit=True) as conn:
        app.enqueue_many(JobSpec("t", {"n": n}) for n in range(1500))
        conn.execute("DELETE FROM queued_jobs")

        def warned() -> dict[str, Any] | None:
            # PostgreSQL 14 sends a session's counts to the statistics collector only at its
            # next statement (at most every 500 ms): poke the session that deleted the rows.
            conn.execute("SELECT 1")
            _, checks = checks_of(capsys, private.url)
            check = checks["queued_jobs_vacuum"]
            return check if check["status"] == "warn" else None

        # The statistics reach pg_stat_user_tables within a second or so of the commit.
        check = wait_until(warned, timeout=30, what="queued_jobs' dead rows counted")
        assert check["details"]["dead_rows"] >= 1000
        assert "too many dead rows" in check["message"]
        assert check["fix"].startswith("VACUUM (ANALYZE) queued_jobs")
        conn.execute("VACUUM queued_jobs")

        def vacuumed() -> bool:
            conn.execute("SELECT 1")  # as above
            status = checks_of(capsys, private.url)[1]["queued_jobs_vacuum"]["status"]
            return bool(status == "pass")

        wait_until(vacuumed, timeout=30, what="the vacuum counted")


def test_missing_partitions_and_rows_in_the_default_partition_warn(capsys, create_database):
    private = create_database()
    migrate.upgrade(private)
    with psycopg.connect(private.url, autocommit=True) as conn:
        today = scalar(conn, "SELECT (now() AT TIME ZONE 'UTC')::date")
        tomorrow = archive.partition_name(today + timedelta(days=1))
        conn.execute(f"DROP TABLE {tomorrow}")
        far = datetime.now(UTC) + timedelta(days=40)  # past every partition made ahead
        conn.execute(
            "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts,"
            " max_attempts, status, created_at, finished_at)"
            " VALUES (1, 'q', 't', '{}', 0, now(), 1, 5, 'succeeded', now(), %s)",
            [far],
        )
    code, checks = checks_of(capsys, private.url)
    assert code == 0
    partitions = checks["archive_partitions"]
    assert partitions["status"] == "warn", partitions
    assert partitions["details"]["missing"] == [tomorrow]
    assert tomorrow in partitions["message"]
    assert "archive-partitions service" in partitions["fix"]
    default = checks["archive_default_partition"]
    assert default["status"] == "warn", default
    assert default["details"] == {"partition": "archived_jobs_default", "rows": 1}


def test_a_connection_budget_too_small_for_the_plan_fails(capsys, dsn):
    code, checks = checks_of(capsys, dsn.url, "--workers", "1000")
    assert code == 1
    budget = checks["connection_budget"]
    assert budget["status"] == "fail"
    assert budget["message"].startswith("over budget: 1000 worker(s) x 5 connections = 5000")
    assert budget["details"]["planned_connections"] == 5000
    _, checks = checks_of(capsys, dsn.url, "--workers", "2", "--connections-per-worker", "3")
    assert checks["connection_budget"]["details"]["planned_connections"] == 6


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--connections-per-worker", "3"], ["give the number of workers"]),
        (["--workers", "-1"], ["workers must be >= 0"]),
        (["--workers", "2", "--connections-per-worker", "0"], ["connections per worker"]),
        (["--workers", "many"], ["--workers"]),
    ],
)
def test_bad_planning_inputs_are_one_line_and_exit_2(capsys, dsn, args, words):
    code, out, err = run(capsys, "doctor", "--dsn", dsn.url, *args)
    assert code == 2
    assert out == ""
    assert_one_line_error(code, err, *words)


def test_an_unreachable_database_is_a_failed_connection_check(capsys):
    code, out, err = run(capsys, "doctor", "--dsn", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert code == 1
    assert err == ""
    assert line_of(out, "connection").startswith("FAIL")
    assert "cannot reach the database" in out
    code, out, _ = run(
        capsys, "doctor", "--dsn", "postgresql://postgres@127.0.0.1:1/nowhere", "--json"
    )
    assert json.loads(out)["summary"]["failed"] == 1


@pytest.fixture
def proxied(dsn: Dsn) -> Iterator[Callable[[], str]]:
    """A TCP relay in front of the test server (reached as its URL says: on TCP, or on a Unix
    socket as the embedded server is): the URL through it names another port than the one the
    server listens on, as a DSN through a pooler does."""
    target = conninfo_to_dict(dsn.url)
    host, server_port = str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432)
    if "," in host:
        pytest.skip("the test server's URL names several hosts")

    def connect_server() -> socket.socket:
        if host.startswith("/"):
            unix = socket.socket(socket.AF_UNIX)
            unix.connect(f"{host}/.s.PGSQL.{server_port}")
            return unix
        return socket.create_connection((host, server_port))

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()
    opened: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            server = connect_server()
            opened.extend((client, server))
            for a, b in ((client, server), (server, client)):
                threads.append(threading.Thread(target=pump, args=(a, b), daemon=True))
                threads[-1].start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield lambda: url_with(dsn.url, host="127.0.0.1", port=port)
    stop.set()
    acceptor.join(5)
    listener.close()
    for sock in opened:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    for thread in threads:
        thread.join(5)
    for sock in opened:
        sock.close()


def test_a_dsn_through_a_relay_warns_that_a_pooler_sits_in_between(capsys, proxied):
    _, checks = checks_of(capsys, proxied())
    pooler = checks["pooler"]
    assert pooler["status"] == "warn", pooler
    assert "a pooler or proxy sits in between" in pooler["message"]
    assert "session mode" in pooler["fix"]
    assert pooler["details"]["dsn_port"] != pooler["details"]["server_port"]


@pytest.mark.parametrize(
    ("round_trip", "same_session", "said"),
    [
        (None, True, "a NOTIFY did not come back to its LISTENing connection within 2s"),
        (0.01, False, "consecutive statements ran on different server sessions"),
    ],
)
def test_what_a_transaction_mode_pooler_does_fails_the_pooler_check(
    dsn, monkeypatch, round_trip, same_session, said
):
    # What PgBouncer in transaction mode does to a LISTEN and to a session, played without one.
    monkeypatch.setattr(doctor_connections, "_listen_round_trip", lambda _dsn, _timeout: round_trip)
    monkeypatch.setattr(doctor_connections, "_same_session", lambda _conn: same_session)
    report = doctor.diagnose(dsn)
    pooler = next(c for c in report.checks if c.name == "pooler")
    assert pooler.status is doctor.Status.FAIL
    assert pooler.message.startswith(said)
    assert "transaction-mode pooler" in pooler.message
    assert pooler.fix is not None and "session-mode pool" in pooler.fix
    assert report.exit_code == 1


def test_a_running_worker_counts_in_the_connection_budget(capsys, dsn, subprocess_env):
    with pgjobs_process(
        subprocess_env, "work", "--app", "tests.integration.cli_app:app", "--concurrency", "2"
    ) as worker:

        def registered() -> dict[str, Any] | None:
            _, checks = checks_of(capsys, dsn.url)
            budget = checks["connection_budget"]
            return checks if budget["details"]["live_workers"] == 1 else None

        checks = wait_until(registered, timeout=30, what="the worker registered", procs=[worker])
        budget = checks["connection_budget"]["details"]
        assert budget["live_worker_connections"] == doctor.WORKER_CONNECTIONS
        assert budget["in_use_by_pgjobs"] >= 2  # at least its claim and LISTEN connections
        assert checks["stale_workers"]["status"] == "pass"
        assert checks["orphaned_leases"]["status"] == "pass"
        assert worker.stop() == 0
