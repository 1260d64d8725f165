"""Upgrades in deploy pipelines: a downgrade and upgrade while a worker processes jobs loses
none; migrations wait for locks no longer than their lock_timeout, and can be run again after
such a failure; `pgjobs migrate --check` gates a pipeline. (An application's own Alembic run
that includes pgjobs' migrations is tested from the installed wheel, in
tests/acceptance/test_wheel.py.)"""

from __future__ import annotations

import threading

import psycopg
import pytest

from pgjobs import App, JobSpec, migrate
from tests.support.helpers import assert_one_home, pgjobs_env, pgjobs_process, run, wait_until


def test_downgrade_and_upgrade_while_a_worker_runs_lose_no_job(create_database):
    dsn = create_database()
    migrate.upgrade(dsn)
    ids: list[int] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def produce(app: App) -> None:
        try:
            while not stop.is_set():
                ids.extend(app.enqueue_many([JobSpec("ops.add", {"a": 1, "b": 2})] * 20))
                stop.wait(0.02)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    with (
        psycopg.connect(dsn.url, autocommit=True) as conn,
        App(dsn.url, check_task_names=False) as app,
        pgjobs_process(
            pgjobs_env(dsn.url),
            "work",
            "--app",
            "tests.integration.ops_app:app",
            "--poll-interval",
            "0.1",
        ) as worker,
    ):

        def archived() -> int:
            return int(conn.execute("SELECT count(*) FROM archived_jobs").fetchone()[0])  # type: ignore[index]

        producer = threading.Thread(target=produce, args=(app,))
        producer.start()
        try:
            wait_until(lambda: archived() >= 100 or not worker.alive(), timeout=60, what="work")
            # This worker's statements need the newest columns: on the older schema it keeps
            # its outcomes and waits (a deploy rolls code back before the schema), losing none.
            migrate.downgrade(dsn, "0003")
            wait_until(lambda: "schema refused" in worker.err(), timeout=60, what="a refusal")
            migrate.upgrade(dsn)
            after = archived()
            wait_until(lambda: archived() > after + 100, timeout=60, what="work on head")
        finally:
            stop.set()
            producer.join(30)
        assert not failures, failures
        wait_until(
            lambda: archived() == len(ids) or not worker.alive(), timeout=60, what="all jobs done"
        )
        assert worker.alive(), worker.err()
        assert_one_home(conn, ids)
        assert conn.execute(
            "SELECT count(*) FROM archived_jobs WHERE status = 'succeeded' AND result = '3'"
        ).fetchone() == (len(ids),)
        assert worker.stop() == 0
        log = worker.err()
    assert "dropped" not in log and "not applied" not in log, log
    assert "database connection restored" in log, log


def test_lock_timeout_fails_fast_and_the_migration_can_run_again(capsys, create_database):
    dsn = create_database()
    migrate.upgrade(dsn, "0003")
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, "
            "max_attempts, status, created_at) "
            "VALUES (1, 'q', 't', '{}', 0, now(), 1, 5, 'succeeded', now())"
        )
    with psycopg.connect(dsn.url) as reader:  # a long report over the archive, in a transaction
        reader.execute("SELECT count(*) FROM archived_jobs").fetchone()
        code, _, err = run(capsys, "migrate", "--lock-timeout", "300ms", "--dsn", dsn.url)
        assert code == 1
        assert err.startswith("pgjobs: error: ") and err.count("\n") == 1
        assert "lock" in err, err
        assert migrate.current(dsn) == "0003"
    code, _, err = run(capsys, "migrate", "--dsn", dsn.url)
    assert code == 0, err
    assert migrate.current(dsn) == migrate.head()
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        assert conn.execute("SELECT id FROM archived_jobs").fetchall() == [(1,)]
        invalid = conn.execute("SELECT count(*) FROM pg_index WHERE NOT indisvalid").fetchone()
        assert invalid == (0,), "the index left INVALID by the failed run was rebuilt"


def test_migrate_check_gates_a_pipeline(capsys, create_database):
    dsn = create_database()
    migrate.upgrade(dsn, "0003")
    code, out, _ = run(capsys, "migrate", "--check", "--dsn", dsn.url)
    assert code == 1 and out.split() == ["current:", "0003", "head:", migrate.head()]
    migrate.upgrade(dsn)
    code, out, _ = run(capsys, "migrate", "--check", "--dsn", dsn.url)
    assert code == 0 and out.split() == ["current:", migrate.head(), "head:", migrate.head()]


def test_offline_sql_sets_the_lock_timeout_and_builds_indexes_concurrently(capsys):
    code, out, _ = run(capsys, "migrate", "--sql", "--lock-timeout", "2s")
    assert code == 0
    assert out.index("SET lock_timeout = '2s'") < out.index("CREATE TABLE queued_jobs")
    assert "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS archived_jobs_id_finished_at_key" in out
    assert "PARTITION BY RANGE (finished_at)" in out
    code, _, err = run(capsys, "migrate", "--sql", "--lock-timeout", "soon")
    assert code == 2 and "lock timeout" in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["10s", "500ms", "0", "1min"])
def test_lock_timeout_values_pass_through(value):
    assert f"SET lock_timeout = '{value}'" in migrate.sql("0003:0004", lock_timeout=value)
