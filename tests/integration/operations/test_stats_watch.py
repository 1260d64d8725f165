"""`pgjobs stats`: throughput and retry rate over the last minute, live workers, table health
(--verbose), and --watch refreshing in place until Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs.models import ArchivedStatus, DeadReason
from tests.support.helpers import (
    database_name,
    pgjobs_command,
    pgjobs_env,
    pgjobs_process,
    run,
    wait_until,
)
from tests.support.urls import url_with


def archive(
    conn: psycopg.Connection[Any], queue: str, attempts: int, status: ArchivedStatus, ago: str
) -> None:
    conn.execute(
        "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, status, created_at, finished_at) "
        "VALUES (nextval(pg_get_serial_sequence('queued_jobs', 'id')), %s, 't', '{}', 0, now(), "
        "%s, 5, %s, now(), now() - %s::interval)",
        [queue, attempts, status, ago],
    )


def bury(conn: psycopg.Connection[Any], queue: str, attempts: int, reason: DeadReason) -> None:
    conn.execute(
        "INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, reason, created_at) "
        "VALUES (nextval(pg_get_serial_sequence('queued_jobs', 'id')), %s, 't', '{}', 0, now(), "
        "%s, 5, %s, now())",
        [queue, attempts, reason],
    )


@pytest.fixture
def last_minute(conn):
    """Queue "q" in the last minute: 6 jobs that ran and were archived (2 of them on their third
    attempt), 1 cancelled unrun, 2 dead (one after 5 attempts); one more archived 10 minutes ago."""
    for _ in range(4):
        archive(conn, "q", 1, ArchivedStatus.SUCCEEDED, "1 second")
    for _ in range(2):
        archive(conn, "q", 3, ArchivedStatus.SUCCEEDED, "2 seconds")
    archive(conn, "q", 0, ArchivedStatus.CANCELLED, "1 second")
    archive(conn, "q", 2, ArchivedStatus.SUCCEEDED, "10 minutes")
    bury(conn, "q", 5, DeadReason.EXHAUSTED)
    bury(conn, "q", 1, DeadReason.NON_RETRYABLE)


def test_stats_json_gives_throughput_and_retry_rate(capsys, dsn, last_minute):
    code, out, err = run(capsys, "stats", "--json", "--dsn", dsn.url)
    assert code == 0, err
    [q] = json.loads(out)
    assert q["queue"] == "q"
    assert (q["finished_last_hour"], q["finished_last_minute"], q["failed_last_minute"]) == (
        8,
        7,
        2,
    )
    assert q["throughput_per_second"] == round(7 / 60, 3)
    # Ran and finished in the last minute: 6 archived + 2 dead; more than one attempt: 2 + 1.
    assert (q["retried_last_minute"], q["ran_last_minute"]) == (3, 8)
    assert q["retry_rate"] == 0.375


def test_stats_table_shows_rates_and_says_when_no_worker_is_live(capsys, dsn, last_minute):
    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    assert "jobs/s" in out and "retry" in out
    [line] = [line for line in out.splitlines() if line.startswith("│ q ")]
    cells = [cell.strip() for cell in line.split("│")[1:-1]]
    # queue, ready, scheduled, waiting, running, dead, done 1h, failed 1h
    assert cells[:8] == ["q", "0", "0", "0", "0", "2", "8", "2"]
    assert cells[8:10] == ["0.1", "38%"]
    assert "no live workers" in out


def test_stats_verbose_shows_dead_rows_autovacuum_settings_and_partitions(capsys, dsn, conn):
    conn.execute("INSERT INTO queued_jobs (task) SELECT 't' FROM generate_series(1, 30)")
    conn.execute("DELETE FROM queued_jobs WHERE id % 3 = 0")

    def dead_rows_counted() -> bool:
        # PostgreSQL 14 sends a backend's table counts at its next statement (at most every
        # 500 ms), not while it idles; 15 and newer also flush them from an idle backend.
        conn.execute("SELECT 1")
        code, out, _ = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
        tables = {t["table"]: t for t in json.loads(out)["tables"]}
        return code == 0 and (tables["queued_jobs"]["dead_rows"] or 0) >= 10

    wait_until(dead_rows_counted, timeout=15, what="pg_stat_user_tables to count the deletes")
    code, out, err = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
    assert code == 0, err
    report = json.loads(out)
    assert set(report) >= {"queues", "workers", "orphaned_leases", "tables", "archive_partitions"}
    tables = {t["table"]: t for t in report["tables"]}
    assert set(tables) == {"queued_jobs", "archived_jobs", "dead_letter", "pgjobs_workers"}
    hot = tables["queued_jobs"]
    assert hot["dead_ratio"] == pytest.approx(hot["dead_rows"] / hot["live_rows"])
    assert "autovacuum_vacuum_scale_factor=0.01" in hot["options"]
    assert tables["archived_jobs"]["partitions"] >= 5  # today + 3 ahead + default
    assert report["archive_default_rows"] == 0

    code, out, err = run(capsys, "stats", "--verbose", "--dsn", dsn.url)
    assert code == 0, err
    for words in (
        "dead/live",
        "last autovacuum",
        "queued_jobs storage options:",
        "autovacuum_vacuum_scale_factor=0.01",
        "archived_jobs partitions:",
    ):
        assert words in out, out


def _read_pty(fd: int, into: list[bytes]) -> None:
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.append(chunk)


def test_stats_watch_redraws_in_place_and_ctrl_c_exits_0(dsn, conn):
    conn.execute("INSERT INTO queued_jobs (queue, task) VALUES ('watched', 't')")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        pgjobs_command("stats", "--watch", "--interval", "0.2"),
        env=pgjobs_env(dsn.url),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    chunks: list[bytes] = []
    try:

        def redrawn_twice() -> bool:
            _read_pty(master, chunks)
            return b"".join(chunks).count(b"pgjobs queues") >= 3 or proc.poll() is not None

        wait_until(redrawn_twice, timeout=30, what="three drawings of the stats")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        _read_pty(master, chunks)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    screen = b"".join(chunks).decode(errors="replace")
    assert "watched" in screen and "live workers" in screen
    assert "\x1b[" in screen, "redrawn in place with cursor movements"
    assert proc.stderr is not None
    with proc.stderr:
        assert proc.stderr.read() == b""


def test_stats_watch_json_prints_a_line_per_reading_and_survives_a_lost_database(
    create_database, tmp_path: Path
):
    from pgjobs import migrate

    doomed = create_database()
    migrate.upgrade(doomed)
    with pgjobs_process(
        pgjobs_env(doomed.url), "stats", "--watch", "--json", "--interval", "0.2"
    ) as watch:

        def lines() -> list[Any]:
            return [json.loads(line) for line in watch.out().splitlines() if line.strip()]

        wait_until(lambda: len(lines()) >= 2 or not watch.alive(), timeout=20, what="2 readings")
        assert all(isinstance(reading, list) for reading in lines()), watch.err()
        with psycopg.connect(url_with(doomed.url, dbname="postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{database_name(doomed.url)}" WITH (FORCE)')
        wait_until(
            lambda: any("error" in r for r in lines() if isinstance(r, dict)) or not watch.alive(),
            timeout=20,
            what="an error reading",
        )
        assert watch.alive(), watch.err()
        errors = [r["error"] for r in lines() if isinstance(r, dict)]
        # Which reading sees the drop first depends on timing: the session ended, or the
        # database gone.
        said = ("does not exist", "cannot reach", "closed by the server")
        assert any(words in e for e in errors for words in said), errors
        assert watch.stop(signal.SIGINT) == 0
    time.sleep(0)  # nothing to wait for: the process has exited
