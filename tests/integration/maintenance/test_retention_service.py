"""The retention service against a real PostgreSQL: a round drops the archive's expired
partitions (as `pgjobs prune` does) and deletes old dead letters and rows of queues with shorter
periods in batches, exports first when asked, runs one worker at a time, comes first within 30 s
of a worker's start, and is off without a policy; bad periods are refused in one line by every
surface; `pgjobs doctor` suggests a policy while the archive grows without one."""

from __future__ import annotations

import asyncio
import csv
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs import App, migrate, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import ServiceConfig, run_services
from pgjobs.maintenance.partitions import ArchivePartitions
from pgjobs.maintenance.retainer import Retained, Retainer
from pgjobs.models import DeadReason
from pgjobs.retention_policy import RetentionPolicy
from pgjobs.worker import WorkerConfig
from pgjobs.worker import services as worker_services
from tests.integration.maintenance.test_retention import archive, partitions, where_rows_are
from tests.support.factories import run_service
from tests.support.helpers import assert_one_line_error, run, wait_until

NOW = datetime.now(UTC)


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


def archived_at(conn: psycopg.Connection[Any], ages: Mapping[int, tuple[str, float]]) -> None:
    """Archived jobs: id -> (queue, days since they finished), each in the partition of its day
    (made by the archive-partitions service)."""
    for job_id, (queue, days) in ages.items():
        archive(conn, job_id, NOW - timedelta(days=days, seconds=job_id))
        conn.execute("UPDATE archived_jobs SET queue = %s WHERE id = %s", [queue, job_id])


def dead_at(conn: psycopg.Connection[Any], ages: Mapping[int, tuple[str, float]]) -> None:
    """Dead letters: id -> (queue, days since they failed)."""
    for job_id, (queue, days) in ages.items():
        failed = NOW - timedelta(days=days, seconds=job_id)
        conn.execute(
            "INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, "
            "max_attempts, reason, created_at, failed_at) "
            "VALUES (%s, %s, 't', '{}', 0, %s, 5, 5, %s, %s, %s)",
            [job_id, queue, failed, DeadReason.EXHAUSTED, failed, failed],
        )


def dead_ids(conn: psycopg.Connection[Any]) -> set[int]:
    return {row[0] for row in conn.execute("SELECT id FROM dead_letter").fetchall()}


def retainer(dsn: Dsn, batch_size: int = 1000, **settings: Any) -> Retainer:
    config = ServiceConfig(interval=Retainer.default_interval, batch_size=batch_size)
    return Retainer(RetentionPolicy.of(settings), dsn, config, lock_timeout=20.0)


def test_a_round_drops_expired_partitions_and_deletes_old_dead_letters_in_batches(
    fresh, fresh_conn
):
    archived_at(fresh_conn, {1: ("q", 45), 2: ("q", 40), 3: ("q", 35), 4: ("q", 10), 5: ("q", 0)})
    run_service(fresh, ArchivePartitions())
    old = {p for job_id, p in where_rows_are(fresh_conn).items() if job_id <= 3}
    dead_at(fresh_conn, {10 + n: ("q", 100 + n) for n in range(5)} | {20: ("q", 5)})

    service = retainer(fresh, batch_size=2, archive="30d", dead_letter="90d")
    result = run_service(fresh, service)

    assert result == Retained(partitions=len(old), archived=3, dead=5)
    assert set(where_rows_are(fresh_conn)) == {4, 5}
    assert not old & set(partitions(fresh_conn)), "whole partitions dropped"
    assert "archived_jobs_default" in partitions(fresh_conn)
    assert dead_ids(fresh_conn) == {20}
    assert run_service(fresh, service) == Retained(0, 0, 0), "nothing left to remove"


def test_queues_keep_their_own_periods_shorter_or_longer_than_the_tables(fresh, fresh_conn):
    archived_at(
        fresh_conn,
        {
            1: ("reports", 10),  # past reports' 7 days
            2: ("reports", 3),
            3: ("q", 40),  # past the archive's 30 days, in a partition audit's 60 days keep
            4: ("q", 20),
            5: ("audit", 40),
            6: ("audit", 70),  # past audit's 60 days: its partition goes whole
        },
    )
    run_service(fresh, ArchivePartitions())
    dead_at(fresh_conn, {10: ("reports", 10), 11: ("reports", 3), 12: ("q", 100), 13: ("q", 50)})

    result = run_service(
        fresh,
        retainer(
            fresh,
            archive="30d",
            dead_letter="90d",
            queues={"reports": {"archive": "7d", "dead_letter": "7d"}, "audit": {"archive": "60d"}},
        ),
    )

    assert set(where_rows_are(fresh_conn)) == {2, 4, 5}
    assert dead_ids(fresh_conn) == {11, 13}
    assert result.archived == 3 and result.dead == 2
    assert result.partitions >= 1


def test_rows_of_the_default_partition_past_the_period_are_deleted(fresh, fresh_conn):
    archived_at(fresh_conn, {1: ("q", 50), 2: ("q", 5)})  # no partitions: both in the DEFAULT
    assert set(where_rows_are(fresh_conn).values()) == {"archived_jobs_default"}
    assert run_service(fresh, retainer(fresh, archive="30d")) == Retained(0, 1, 0)
    assert set(where_rows_are(fresh_conn)) == {2}


def test_the_export_copies_every_row_before_it_goes(fresh, fresh_conn, tmp_path):
    archived_at(fresh_conn, {1: ("q", 45), 2: ("q", 5), 3: ("reports", 10)})
    run_service(fresh, ArchivePartitions())
    dropped = where_rows_are(fresh_conn)[1]
    dead_at(fresh_conn, {10: ("q", 100), 11: ("q", 101), 12: ("q", 102), 13: ("q", 1)})
    service = retainer(
        fresh,
        batch_size=2,
        archive="30d",
        dead_letter="90d",
        queues={"reports": {"archive": "7d"}},
        export=str(tmp_path),
    )

    run_service(fresh, service)
    dead_at(fresh_conn, {14: ("q", 103)})
    run_service(fresh, service)  # appends to the same file, its header once

    def exported(name: str) -> list[dict[str, str]]:
        with (tmp_path / name).open(newline="") as handle:
            return list(csv.DictReader(handle))

    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(
        [f"{dropped}.csv", "archived_jobs.csv", "dead_letter.csv"]
    )
    assert [int(r["id"]) for r in exported(f"{dropped}.csv")] == [1]
    assert [int(r["id"]) for r in exported("archived_jobs.csv")] == [3]
    dead = exported("dead_letter.csv")
    assert sorted(int(r["id"]) for r in dead) == [10, 11, 12, 14]
    assert all(r["reason"] == DeadReason.EXHAUSTED for r in dead)
    assert dead_ids(fresh_conn) == {13}


def _holds_turn(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND ((classid::bigint << 32) | objid::bigint) = %s",
        [queries.RETENTION_LOCK_KEY],
    ).fetchone()
    return bool(row and row[0])


def test_two_workers_at_once_one_does_the_round(fresh, fresh_conn):
    dead_at(fresh_conn, {n: ("q", 100 + n) for n in range(1, 7)})
    archived_at(fresh_conn, {20: ("q", 45)})
    run_service(fresh, ArchivePartitions())
    # A worker without the turn would wait on dead_letter like the first one: this makes it fail
    # instead of hanging.
    name = fresh_conn.execute("SELECT current_database()").fetchone()[0]
    fresh_conn.execute(f"ALTER DATABASE {name} SET lock_timeout = '20s'")
    first, second = (retainer(fresh, archive="30d", dead_letter="90d") for _ in range(2))

    async def two_workers() -> tuple[Retained, Retained]:
        a = await psycopg.AsyncConnection.connect(fresh.url, autocommit=True)
        b = await psycopg.AsyncConnection.connect(fresh.url, autocommit=True)
        with psycopg.connect(fresh.url, autocommit=True) as blocker:
            # The first round takes the turn, then waits on dead_letter until this lets go.
            blocker.execute("BEGIN")
            blocker.execute("LOCK TABLE dead_letter IN SHARE MODE")
            one = asyncio.ensure_future(first.run_once(a))
            await asyncio.to_thread(
                wait_until, lambda: _holds_turn(fresh_conn), timeout=30, what="the turn taken"
            )
            other = await second.run_once(b)
            blocker.execute("COMMIT")
        done = await one
        await a.close()
        await b.close()
        return done, other

    done, other = asyncio.run(two_workers())
    assert other == Retained(0, 0, 0)
    assert done.dead == 6 and done.archived == 1 and done.partitions == 1
    assert dead_ids(fresh_conn) == set()
    assert not _holds_turn(fresh_conn), "the turn is given back"


def test_the_first_round_comes_within_30_seconds_of_a_workers_start(fresh, fresh_conn, monkeypatch):
    dead_at(fresh_conn, {1: ("q", 100), 2: ("q", 1)})
    app = App(fresh.url, retention={"dead_letter": "90d"})
    found = worker_services.maintenance(app, WorkerConfig(), ["q"], [])
    (service,) = [s for s in found if isinstance(s, Retainer)]
    assert service.config.interval == 3600.0  # hourly rounds, yet the first comes at once
    # The longest first delay the loop can draw, and what it waited before the first round.
    monkeypatch.setattr(random, "random", lambda: 1.0 - 1e-12)
    delays: list[float] = []
    first_delay = ServiceConfig.first_delay

    def recorded(config: ServiceConfig) -> float:
        delays.append(first_delay(config))
        return delays[-1]

    monkeypatch.setattr(ServiceConfig, "first_delay", recorded)

    stop = asyncio.Event()

    class Once(Retainer):
        async def run_once(self, conn: Any) -> Retained:
            result = await super().run_once(conn)
            stop.set()
            return result

    async def worker_services_until_the_first_round() -> None:
        once = Once(service.policy, service.dsn, service.config)
        await run_services([once], fresh, stop)

    asyncio.run(worker_services_until_the_first_round())
    assert len(delays) == 1 and 0 <= delays[0] <= 30
    assert dead_ids(fresh_conn) == {2}


def test_without_a_policy_no_worker_runs_the_service_and_nothing_goes(fresh, fresh_conn):
    archived_at(fresh_conn, {1: ("q", 400)})
    dead_at(fresh_conn, {2: ("q", 400)})
    app = App(fresh.url)
    for config in (WorkerConfig(), WorkerConfig(retention=RetentionPolicy(queues={}))):
        found = worker_services.maintenance(app, config, ["q"], [])
        assert not [s for s in found if isinstance(s, Retainer)]
        for service in found:
            run_service(fresh, service)
    with_policy = App(fresh.url, retention={"archive": "30d"})
    off = worker_services.maintenance(with_policy, WorkerConfig(maintenance=False), ["q"], [])
    assert off == []
    assert set(where_rows_are(fresh_conn)) == {1}
    assert dead_ids(fresh_conn) == {2}
    with pytest.raises(ConfigurationError, match="needs a policy with a period"):
        Retainer(RetentionPolicy(), fresh)


def test_flags_override_the_file_and_the_file_the_app(fresh, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pgjobs.retention]\narchive = "30d"\ndead_letter = "90d"\n\n'
        '[tool.pgjobs.retention.queues.reports]\narchive = "7d"\n'
    )
    monkeypatch.chdir(tmp_path)
    from pgjobs.cli.work import _retention, work_argv

    policy = _retention(None, "14d", None)
    assert policy is not None
    assert policy.archive == timedelta(days=30)
    assert policy.dead_letter == timedelta(days=14)
    assert policy.queues["reports"].archive == timedelta(days=7)
    app = App(fresh.url, retention={"archive": "365d", "dead_letter": "365d"})
    (service,) = [
        s
        for s in worker_services.maintenance(app, WorkerConfig(retention=policy), ["q"], [])
        if isinstance(s, Retainer)
    ]
    assert service.policy.archive == timedelta(days=30)
    assert service.policy.dead_letter == timedelta(days=14)
    argv = work_argv("app:app", WorkerConfig(retention=policy), "info")
    assert "--retain-archive=2592000s" in argv
    assert "--retain-dead=1209600s" in argv


# -- bad periods: one line, nothing written ------------------------------------------------------

BAD_PERIODS = ["0d", "0s", "-1d", "5218w", "1e400d", "30", "soon"]


@pytest.mark.parametrize("period", BAD_PERIODS)
def test_a_bad_period_in_pyproject_is_one_line_and_exit_2(
    capsys, dsn, conn, tmp_path, monkeypatch, period
):
    dead_at(conn, {1: ("q", 400)})
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.pgjobs]\napp = "nowhere:app"\n\n[tool.pgjobs.retention]\ndead_letter = "{period}"\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "work", "--burst", "--dsn", dsn.url)
    assert (code, out) == (2, "")
    assert_one_line_error(code, err, "[tool.pgjobs.retention]", "dead_letter", "positive age")
    assert dead_ids(conn) == {1}


@pytest.mark.parametrize("period", BAD_PERIODS)
@pytest.mark.parametrize("option", ["--retain-archive", "--retain-dead"])
def test_a_bad_period_flag_is_one_line_and_exit_2(capsys, dsn, option, period):
    code, out, err = run(capsys, "work", "--burst", f"{option}={period}", "--dsn", dsn.url)
    assert (code, out) == (2, "")
    assert_one_line_error(code, err, option, "positive age", "100 years")


@pytest.mark.parametrize(
    "value",
    [
        *BAD_PERIODS,
        timedelta(0),
        timedelta(days=-1),
        timedelta(days=36526),
        30,
    ],
)
def test_a_bad_period_in_app_is_one_line_configuration_error(value):
    for settings in ({"archive": value}, {"queues": {"reports": {"dead_letter": value}}}):
        with pytest.raises(ConfigurationError) as refused:
            App("postgresql://postgres@127.0.0.1/x", retention=settings)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith("App(retention=...)")
        assert "positive age" in message


# -- pgjobs doctor -------------------------------------------------------------------------------


def test_doctor_suggests_a_policy_while_the_archive_grows_without_one(
    capsys, fresh, fresh_conn, tmp_path, monkeypatch
):
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.pgjobs]\napp = "nowhere:app"\n')

    def check() -> dict[str, Any]:
        code, out, err = run(capsys, "doctor", "--dsn", fresh.url, "--json")
        assert code in (0, 1) and err == "", err
        found = {c["name"]: c for c in json.loads(out)["checks"]}
        return found["archive_retention"]  # type: ignore[no-any-return]

    archived_at(fresh_conn, {1: ("q", 80)})
    assert check()["status"] == "pass", "80 days: not yet"

    archived_at(fresh_conn, {2: ("q", 120)})
    run_service(fresh, ArchivePartitions())
    warned = check()
    assert warned["status"] == "warn"
    assert "120 days of history" in warned["message"]
    assert "[tool.pgjobs.retention]" in warned["fix"]

    # The file names a policy: the archive is kept that long on purpose.
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pgjobs]\napp = "nowhere:app"\n\n[tool.pgjobs.retention]\narchive = "365d"\n'
    )
    assert check()["status"] == "pass"

    # Or the policy is the app's: once its workers applied it, the suggestion is gone.
    (tmp_path / "pyproject.toml").write_text('[tool.pgjobs]\napp = "nowhere:app"\n')
    run_service(fresh, retainer(fresh, archive="30d"))
    passed = check()
    assert passed["status"] == "pass", passed
    assert set(where_rows_are(fresh_conn)) == set()


def test_a_path_that_is_no_folder_is_refused_as_export(tmp_path: Path):
    with pytest.raises(ConfigurationError, match="not a folder"):
        RetentionPolicy.of({"archive": "30d", "export": str(tmp_path / "missing")})
