"""Retention: archived_jobs partitioned by day, converted in place by migration 0004 (and back),
partitions made ahead by the archive-partitions service, and `pgjobs prune` with and without an
export."""

from __future__ import annotations

import asyncio
import csv
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, migrate
from pgjobs.archive import partition_name
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance.partitions import ArchivePartitions, Partitioned
from pgjobs.models import ArchivedStatus
from pgjobs.schema import archived_jobs
from tests.support.factories import run_service, work
from tests.support.helpers import assert_one_home, run

OLD_REVISION = "0003"


def archive(
    conn: psycopg.Connection[Any], job_id: int, finished_at: datetime, **extra: Any
) -> None:
    """Insert one archived job that finished at ``finished_at`` (history, as a worker leaves it)."""
    conn.execute(
        "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, status, created_at, finished_at, idempotency_key) "
        "VALUES (%s, 'q', 't', %s::jsonb, 0, %s, 1, 5, %s, %s, %s, %s)",
        [
            job_id,
            f'{{"n": {job_id}}}',
            finished_at,
            ArchivedStatus.SUCCEEDED,
            finished_at,
            finished_at,
            extra.get("key"),
        ],
    )


def partitions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Partition name -> its bound expression."""
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'archived_jobs'::regclass"
    ).fetchall()
    return dict(rows)


def archived(conn: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    return set(conn.execute("SELECT id, finished_at, payload::text FROM archived_jobs").fetchall())


def where_rows_are(conn: psycopg.Connection[Any]) -> dict[int, str]:
    return dict(conn.execute("SELECT id, tableoid::regclass::text FROM archived_jobs").fetchall())


def utc_today(conn: psycopg.Connection[Any]) -> date:
    today: date = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]  # type: ignore[index]
    return today


@pytest.fixture
def fresh(create_database):
    """A database of its own, migrated to head (partition DDL must not disturb other tests)."""
    dsn = create_database()
    migrate.upgrade(dsn)
    return dsn


@pytest.fixture
def fresh_conn(fresh):
    with psycopg.connect(fresh.url, autocommit=True) as conn:
        yield conn


def prune(capsys, dsn: Dsn, *args: str) -> tuple[int, str, str]:
    return run(capsys, "prune", *args, "--dsn", dsn.url)


# -- schema and migration ------------------------------------------------------------------------


def test_archive_is_partitioned_by_day_as_schema_py_says(fresh_conn):
    key = fresh_conn.execute("SELECT pg_get_partkeydef('archived_jobs'::regclass)").fetchone()
    assert key == (archived_jobs.dialect_options["postgresql"]["partition_by"],)
    pk = fresh_conn.execute(
        "SELECT array_agg(a.attname ORDER BY k.ord) FROM pg_index i "
        "CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = 'archived_jobs'::regclass AND i.indisprimary"
    ).fetchone()
    assert pk == ([c.name for c in archived_jobs.primary_key.columns],)
    today = utc_today(fresh_conn)
    names = set(partitions(fresh_conn))
    expected = {partition_name(today + timedelta(days=n)) for n in range(4)}
    assert expected | {"archived_jobs_default"} == names, "no legacy partition: it was empty"


def test_upgrade_converts_rows_in_place_and_downgrade_gives_them_back(create_database):
    dsn = create_database()
    migrate.upgrade(dsn, OLD_REVISION)
    now = datetime.now(UTC)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        for n in range(1, 41):
            archive(conn, n, now - timedelta(days=n), key=f"k{n}" if n % 10 == 0 else None)
        conn.execute("SELECT setval(pg_get_serial_sequence('queued_jobs', 'id'), 100)")
        before = archived(conn)
        old_file = conn.execute("SELECT pg_relation_filenode('archived_jobs'::regclass)").fetchone()

    migrate.upgrade(dsn)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        assert archived(conn) == before
        # The old table is the legacy partition, untouched: same file, nothing rewritten.
        assert (
            conn.execute("SELECT pg_relation_filenode('archived_jobs_legacy'::regclass)").fetchone()
            == old_file
        )
        bounds = partitions(conn)
        assert bounds["archived_jobs_legacy"].startswith("FOR VALUES FROM (MINVALUE) TO (")
        assert set(where_rows_are(conn).values()) == {"archived_jobs_legacy"}

    # The runtime's statements work on the partitioned table: an idempotency key of the history
    # is found, new jobs are archived into today's partition, the claim and settle run.
    with App(dsn.url) as app:

        @app.task(name="noop")
        def noop() -> None:
            pass

        assert app.enqueue("noop", {}, idempotency_key="k20") == 20
        new_ids = [app.enqueue("noop", {}) for _ in range(5)]
        assert work(app) == 0
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        assert_one_home(conn, [*range(1, 41), *new_ids])
        homes = where_rows_are(conn)
        today = partition_name(utc_today(conn))
        assert {homes[i] for i in new_ids} <= {"archived_jobs_legacy", today}
        after = archived(conn)

    migrate.downgrade(dsn, OLD_REVISION)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        assert archived(conn) == after
        assert partitions(conn) == {}
        assert conn.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'archived_jobs'::regclass"
        ).fetchone() == ("r",)
    migrate.upgrade(dsn)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        assert archived(conn) == after


# -- the archive-partitions service ----------------------------------------------------------


def test_partitions_are_made_ahead_once_however_many_workers_try(fresh, fresh_conn):
    today = utc_today(fresh_conn)
    ahead = [partition_name(today + timedelta(days=n)) for n in (1, 2, 3)]
    for name in ahead:
        fresh_conn.execute(f"DROP TABLE {name}")

    async def two_workers_at_once() -> list[Partitioned]:
        conns = [await psycopg.AsyncConnection.connect(fresh.url, autocommit=True) for _ in "ab"]
        try:
            return list(
                await asyncio.gather(*(ArchivePartitions(days_ahead=3).run_once(c) for c in conns))
            )
        finally:
            for c in conns:
                await c.close()

    results = asyncio.run(two_workers_at_once())
    assert sum(r.created for r in results) == 3, results
    assert set(ahead) <= set(partitions(fresh_conn))
    assert run_service(fresh, ArchivePartitions(days_ahead=3)) == Partitioned(created=0, moved=0)
    assert run_service(fresh, ArchivePartitions(days_ahead=5)) == Partitioned(created=2, moved=0)


def test_rows_in_the_default_partition_move_to_a_partition_of_their_day(fresh, fresh_conn):
    long_ago = datetime.now(UTC) - timedelta(days=40)
    archive(fresh_conn, 1, long_ago)
    archive(fresh_conn, 2, long_ago + timedelta(minutes=1))
    archive(fresh_conn, 3, long_ago - timedelta(days=1))
    assert set(where_rows_are(fresh_conn).values()) == {"archived_jobs_default"}

    days = {1: long_ago.date(), 2: (long_ago + timedelta(minutes=1)).date()}
    days[3] = days[1] - timedelta(days=1)
    result = run_service(fresh, ArchivePartitions())
    assert result == Partitioned(created=len(set(days.values())), moved=3)
    assert where_rows_are(fresh_conn) == {n: partition_name(day) for n, day in days.items()}
    assert fresh_conn.execute("SELECT count(*) FROM archived_jobs_default").fetchone() == (0,)


def test_the_service_does_nothing_before_the_archive_is_partitioned(create_database):
    dsn = create_database()
    migrate.upgrade(dsn, OLD_REVISION)
    assert run_service(dsn, ArchivePartitions()) == Partitioned(created=0, moved=0)


# -- pgjobs prune ----------------------------------------------------------------------------


def _history(dsn: Dsn, conn: psycopg.Connection[Any]) -> dict[str, list[int]]:
    """Jobs finished 45, 40 and 35 days ago (two on day 40), 10 days ago and now, each in the
    partition of its day. Returns partition -> ids."""
    now = datetime.now(UTC)
    ages = {1: 45, 2: 40, 3: 40, 4: 35, 5: 10, 6: 0}
    for job_id, days in ages.items():
        archive(conn, job_id, now - timedelta(days=days, seconds=job_id))
    run_service(dsn, ArchivePartitions())
    by_partition: dict[str, list[int]] = {}
    for job_id, partition in sorted(where_rows_are(conn).items()):
        by_partition.setdefault(partition, []).append(job_id)
    assert "archived_jobs_default" not in by_partition
    return by_partition


def test_prune_dry_run_then_prune_drops_whole_old_partitions(capsys, fresh, fresh_conn):
    by_partition = _history(fresh, fresh_conn)
    old = [p for p, ids in by_partition.items() if max(ids) <= 4]
    assert len(old) in (3, 4)  # 4 when jobs 2 and 3 straddle a midnight

    code, out, err = prune(capsys, fresh, "--older-than", "30d", "--dry-run")
    assert code == 0, err
    for name in old:
        assert f"would drop {name}" in out
    assert f"would drop {len(old)} partition(s), 4 rows" in out
    assert set(where_rows_are(fresh_conn)) == {1, 2, 3, 4, 5, 6}, "a dry run drops nothing"

    code, out, err = prune(capsys, fresh, "--older-than", "30d")
    assert code == 0, err
    assert f"dropped {len(old)} partition(s), 4 rows" in out
    assert set(where_rows_are(fresh_conn)) == {5, 6}
    assert not set(old) & set(partitions(fresh_conn))
    assert "archived_jobs_default" in partitions(fresh_conn)

    code, out, err = prune(capsys, fresh, "--older-than", "30d")
    assert code == 0, err
    assert "dropped 0 partition(s), 0 rows" in out


def test_prune_deletes_the_edits_of_the_jobs_it_drops(capsys, fresh, fresh_conn):
    _history(fresh, fresh_conn)
    for job_id in (1, 5):  # an old job's record, a kept one's
        fresh_conn.execute(
            "INSERT INTO pgjobs_job_edits (job_id, edited_by, changes) "
            'VALUES (%s, \'ops\', \'{"priority": {"old": 0, "new": 1}}\')',
            [job_id],
        )
    code, _, err = prune(capsys, fresh, "--older-than", "30d", "--dry-run")
    assert code == 0, err
    assert fresh_conn.execute("SELECT count(*) FROM pgjobs_job_edits").fetchone() == (2,)
    code, _, err = prune(capsys, fresh, "--older-than", "30d")
    assert code == 0, err
    kept = fresh_conn.execute("SELECT job_id FROM pgjobs_job_edits").fetchall()
    assert kept == [(5,)]


def test_prune_exports_one_csv_file_per_partition(capsys, fresh, fresh_conn, tmp_path):
    by_partition = _history(fresh, fresh_conn)
    code, out, err = prune(capsys, fresh, "--older-than", "30d", "--export", str(tmp_path))
    assert code == 0, err
    files = sorted(tmp_path.iterdir())
    old = sorted(p for p, ids in by_partition.items() if max(ids) <= 4)
    assert [f.name for f in files] == [f"{p}.csv" for p in old]
    exported = {}
    for f in files:
        with f.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        exported[f.stem] = sorted(int(r["id"]) for r in rows)
        assert all(
            r["status"] == ArchivedStatus.SUCCEEDED and r["payload"].startswith("{") for r in rows
        )
    assert exported == {p: by_partition[p] for p in old}
    assert f"exported to {tmp_path / old[0]}.csv" in out


def test_prune_appends_copy_text_to_one_file(capsys, fresh, fresh_conn, tmp_path):
    _history(fresh, fresh_conn)
    target = tmp_path / "archive.txt"
    target.write_text("")
    code, _, err = prune(
        capsys, fresh, "--older-than", "5d", "--export", str(target), "--format", "text"
    )
    assert code == 0, err
    lines = target.read_text().splitlines()
    assert sorted(int(line.split("\t")[0]) for line in lines) == [1, 2, 3, 4, 5]
    assert set(where_rows_are(fresh_conn)) == {6}


def test_prune_detaches_concurrently_when_there_is_no_default_partition(fresh, fresh_conn):
    from pgjobs import retention

    by_partition = _history(fresh, fresh_conn)
    fresh_conn.execute("DROP TABLE archived_jobs_default")
    report = retention.prune(fresh, timedelta(days=30))
    assert sorted(p.partition.name for p in report.pruned) == sorted(
        p for p, ids in by_partition.items() if max(ids) <= 4
    )
    assert all(p.concurrently for p in report.pruned)
    assert report.rows == 4
    assert set(where_rows_are(fresh_conn)) == {5, 6}


def test_prune_keeps_the_converted_history_until_all_of_it_is_old(capsys, create_database):
    dsn = create_database()
    migrate.upgrade(dsn, OLD_REVISION)
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        archive(conn, 1, datetime.now(UTC) - timedelta(days=90))
    migrate.upgrade(dsn)
    code, out, err = prune(capsys, dsn, "--older-than", "30d")
    assert code == 0, err
    assert "dropped 0 partition(s)" in out
    assert "kept archived_jobs_legacy" in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--older-than", "soon"], ["--older-than", "30d"]),
        (["--older-than", "0d"], ["positive"]),
        (["--older-than", "30d", "--format", "xml"], ["csv", "text"]),
        (["--older-than", "30d", "--export", "/nonexistent/dir/file.csv"], ["does not exist"]),
    ],
)
def test_prune_bad_input_is_one_line(capsys, fresh, args, words):
    code, _, err = prune(capsys, fresh, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("pgjobs: error: ")
    assert all(word in err for word in words), err


def test_prune_before_the_migration_says_run_pgjobs_migrate(capsys, create_database):
    dsn = create_database()
    migrate.upgrade(dsn, OLD_REVISION)
    code, _, err = prune(capsys, dsn, "--older-than", "30d")
    assert code == 1
    assert err.startswith("pgjobs: error: ") and "pgjobs migrate" in err
