"""Enqueue on the caller's connection: the jobs commit or roll back with the caller's work."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy

from pgjobs import ConfigurationError, JobSpec
from pgjobs.enqueue import COPY_MIN_ROWS
from tests.support.factories import counts, row
from tests.support.helpers import assert_one_home


@pytest.fixture
def engine(dsn):
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    yield engine
    engine.dispose()


def test_psycopg_rollback_leaves_nothing(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        job_id = app.enqueue("t.send", {"to": "a"}, connection=tx)
        assert tx.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert row(conn, "queued_jobs", job_id) is None, "uncommitted job visible to others"
        tx.rollback()
    assert counts(conn) == {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}


def test_psycopg_commit_keeps_the_job_with_the_business_write(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        tx.execute("CREATE TEMP TABLE orders (id int)")
        tx.execute("INSERT INTO orders VALUES (1)")
        job_id = app.enqueue("t.send", {"order": 1}, connection=tx)
        tx.commit()
        assert tx.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None and queued["payload"] == {"order": 1}
    assert_one_home(conn, [job_id])


def test_psycopg_rollback_of_the_business_write_takes_the_job_with_it(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        tx.execute("CREATE TEMP TABLE orders (id int PRIMARY KEY)")
        tx.commit()
        with pytest.raises(psycopg.errors.UniqueViolation), tx.transaction():
            tx.execute("INSERT INTO orders VALUES (1)")
            app.enqueue("t.send", {"order": 1}, connection=tx)
            tx.execute("INSERT INTO orders VALUES (1)")  # the business write fails
    assert counts(conn)["queued_jobs"] == 0


def test_sqlalchemy_rollback_leaves_nothing_and_commit_keeps_the_job(make_app, engine, conn):
    app = make_app(check_task_names=False)
    with engine.connect() as sa_conn:
        app.enqueue("t.send", {"to": "a"}, connection=sa_conn)
        sa_conn.rollback()
        assert counts(conn)["queued_jobs"] == 0

        job_id = app.enqueue("t.send", {"to": "b"}, connection=sa_conn, queue="mail")
        assert row(conn, "queued_jobs", job_id) is None
        sa_conn.commit()
    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None
    assert (queued["queue"], queued["payload"]) == ("mail", {"to": "b"})
    assert_one_home(conn, [job_id])


def test_sqlalchemy_begin_block_rolls_back_on_error(make_app, engine, conn):
    app = make_app(check_task_names=False)
    with pytest.raises(RuntimeError), engine.begin() as sa_conn:
        app.enqueue("t.send", {}, connection=sa_conn)
        raise RuntimeError("business logic failed")
    assert counts(conn)["queued_jobs"] == 0


@pytest.mark.parametrize("size", [3, COPY_MIN_ROWS + 1], ids=["insert", "copy"])
def test_enqueue_many_on_psycopg_connection(make_app, dsn, conn, size):
    app = make_app(check_task_names=False)
    specs = [JobSpec("t.bulk", {"i": i}, priority=i % 3) for i in range(size)]
    with psycopg.connect(dsn.url) as tx:
        app.enqueue_many(specs, connection=tx)
        tx.rollback()
        assert counts(conn)["queued_jobs"] == 0

        ids = app.enqueue_many(specs, connection=tx)
        assert counts(conn)["queued_jobs"] == 0
        tx.commit()
    assert len(set(ids)) == size
    stored = dict(conn.execute("SELECT id, payload FROM queued_jobs").fetchall())
    assert [stored[i] for i in ids] == [{"i": i} for i in range(size)]
    assert_one_home(conn, ids)


def test_enqueue_many_with_keys_on_sqlalchemy_connection(make_app, engine, conn):
    app = make_app(check_task_names=False)
    specs = [JobSpec("t.bulk", {"i": i}, idempotency_key=f"k{i}") for i in range(3)]
    with engine.connect() as sa_conn:
        app.enqueue_many(specs, connection=sa_conn)
        sa_conn.rollback()
        assert counts(conn)["queued_jobs"] == 0
        ids = app.enqueue_many([*specs, JobSpec("t.bulk", {"i": 9})], connection=sa_conn)
        sa_conn.commit()
    assert len(set(ids)) == 4
    keys = dict(conn.execute("SELECT id, idempotency_key FROM queued_jobs").fetchall())
    assert [keys[i] for i in ids] == ["k0", "k1", "k2", None]


def test_connection_of_an_unsupported_kind_is_refused(make_app, conn):
    app = make_app(check_task_names=False)
    with pytest.raises(ConfigurationError, match=r"psycopg\.Connection or a SQLAlchemy"):
        app.enqueue("t.send", {}, connection=object())
    assert counts(conn)["queued_jobs"] == 0
