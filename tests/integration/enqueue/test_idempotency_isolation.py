"""Idempotency in the caller's transaction, at each isolation level: a key never creates a second
job. READ COMMITTED sees the first job wherever it went; REPEATABLE READ and SERIALIZABLE, whose
snapshot may predate it, are refused with a clear error and nothing is written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy
from psycopg import IsolationLevel

from pgjobs import App, ConfigurationError, JobSpec
from pgjobs.completer.outcomes import Outcomes
from tests.support.factories import claim, counts, settle
from tests.support.helpers import assert_one_home

KEY = "order-7"


def _first_job_runs_and_leaves_the_hot_table(app: App, conn: psycopg.Connection[Any]) -> int:
    """Another producer enqueues the key; a worker claims the job and archives it."""
    first = app.enqueue("t.charge", {"order": 7}, idempotency_key=KEY)
    [job] = claim(conn, owner="w")
    outcomes = Outcomes("w")
    outcomes.succeed(job, None)
    assert settle(conn, outcomes) == {first}
    assert assert_one_home(conn, [first]) == {first: "archived_jobs"}
    return first


def test_read_committed_sees_a_job_that_left_since_the_transaction_began(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        tx.isolation_level = IsolationLevel.READ_COMMITTED
        tx.execute("SELECT count(*) FROM queued_jobs")  # the transaction began before the job
        first = _first_job_runs_and_leaves_the_hot_table(app, conn)
        assert app.enqueue("t.charge", {"order": 7}, idempotency_key=KEY, connection=tx) == first
        assert app.enqueue_many([JobSpec("t.charge", idempotency_key=KEY)], connection=tx) == [
            first
        ]
        tx.commit()
    assert counts(conn) == {"queued_jobs": 0, "archived_jobs": 1, "dead_letter": 0}


@pytest.mark.parametrize(
    "level", [IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE], ids=lambda x: x.name
)
def test_snapshot_isolation_is_refused_instead_of_a_second_job(make_app, dsn, conn, level):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        tx.isolation_level = level
        tx.execute("SELECT count(*) FROM queued_jobs")  # the snapshot predates the first job
        first = _first_job_runs_and_leaves_the_hot_table(app, conn)
        name = level.name.replace("_", " ")
        with pytest.raises(ConfigurationError, match=f"READ COMMITTED.*{name}") as raised:
            app.enqueue("t.charge", {"order": 7}, idempotency_key=KEY, connection=tx)
        assert "\n" not in str(raised.value)
        with pytest.raises(ConfigurationError, match=name):
            app.enqueue_many(
                [JobSpec("t.other"), JobSpec("t.charge", idempotency_key=KEY)], connection=tx
            )
        # The transaction is still usable, and jobs without a key go in as before.
        plain = app.enqueue("t.other", connection=tx)
        tx.commit()
    where = assert_one_home(conn, [first, plain])
    assert where == {first: "archived_jobs", plain: "queued_jobs"}
    assert counts(conn) == {"queued_jobs": 1, "archived_jobs": 1, "dead_letter": 0}


def test_snapshot_isolation_on_a_sqlalchemy_connection_is_refused(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    engine = sqlalchemy.create_engine(
        dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool, isolation_level="SERIALIZABLE"
    )
    try:
        with engine.connect() as tx:
            tx.exec_driver_sql("SELECT 1")
            with pytest.raises(ConfigurationError, match="SERIALIZABLE"):
                app.enqueue("t.charge", idempotency_key=KEY, connection=tx)
            tx.commit()
    finally:
        engine.dispose()
    assert counts(conn) == {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}


def test_pgjobs_own_connections_keep_deduplicating(make_app, conn):
    app = make_app(check_task_names=False)
    first = _first_job_runs_and_leaves_the_hot_table(app, conn)
    assert app.enqueue("t.charge", idempotency_key=KEY) == first
    assert counts(conn)["queued_jobs"] == 0
