"""The ways to send an event: ``app.send_event`` (also in the caller's psycopg or SQLAlchemy
transaction, and async), and ``pgjobs event send``; each refusal is one line, exit 2 for bad
input, and writes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import sqlalchemy

from pgjobs import App
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, JobNotFound
from tests.support.helpers import assert_one_line_error, count, run, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def _mail(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT job_id, name, payload FROM pgjobs_events ORDER BY id").fetchall()


def test_app_send_event_by_id_and_key(make_app: Any, conn: psycopg.Connection[Any]) -> None:
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7}, idempotency_key="order-7")
    assert app.send_event(job, "paid", {"amount": 1200}).job_id == job
    assert app.send_event("order-7", "shipped").job_id == job
    assert _mail(conn) == [(job, "paid", {"amount": 1200}), (job, "shipped", None)]


def test_send_event_in_the_callers_transactions(
    make_app: Any, dsn: Dsn, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7})
    with psycopg.connect(dsn.url) as mine:
        app.send_event(job, "paid", connection=mine)
        assert count(conn, "pgjobs_events") == 0  # not committed yet
        mine.rollback()
    assert count(conn, "pgjobs_events") == 0
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.begin() as sa_conn:
            sa_conn.exec_driver_sql("SELECT 1")
            app.send_event(job, "paid", {"via": "sqlalchemy"}, connection=sa_conn)
    finally:
        engine.dispose()
    assert _mail(conn) == [(job, "paid", {"via": "sqlalchemy"})]
    with pytest.raises(ConfigurationError, match=r"must be a psycopg\.Connection"):
        app.send_event(job, "paid", connection=object())


def test_send_event_async(make_app: Any, dsn: Dsn, conn: psycopg.Connection[Any]) -> None:
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7})

    async def main() -> None:
        await app.send_event_async(job, "paid", 1)
        async with await psycopg.AsyncConnection.connect(dsn.url) as mine:
            await app.send_event_async(job, "paid", 2, connection=mine)
            await mine.commit()
            await app.send_event_async(job, "paid", 3, connection=mine)
            await mine.rollback()
        with pytest.raises(JobNotFound):
            await app.send_event_async(10**9, "paid")

    asyncio.run(main())
    assert [p for _, _, p in _mail(conn)] == [1, 2]


def test_pgjobs_event_send(capsys: Any, make_app: Any, dsn: Dsn, conn: psycopg.Connection[Any]):
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7}, idempotency_key="1234")
    code, out, err = run(
        capsys, "event", "send", str(job), "paid", "--payload", '{"amount": 5}', "--dsn", dsn.url
    )
    assert code == 0, err
    assert out.strip() == f"event 'paid' sent to job {job} (kept until the workflow waits for it)"
    code, out, err = run(capsys, "event", "send", "1234", "paid", "--key", "--dsn", dsn.url)
    assert code == 0, err
    assert _mail(conn) == [(job, "paid", {"amount": 5}), (job, "paid", None)]


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["JOB", "paid", "--payload", "{nope"], 2, "--payload is not valid JSON"),
        (["JOB", "paid", "--payload", '"a\\u0000b"'], 2, "NUL"),
        (["JOB", " paid"], 2, "begins or ends with a space"),
        (["99999", "paid"], 1, "no job 99999"),
        (["no-such-key", "paid"], 1, "idempotency key 'no-such-key'"),
    ],
)
def test_pgjobs_event_send_refusals(
    capsys: Any,
    make_app: Any,
    dsn: Dsn,
    conn: psycopg.Connection[Any],
    argv: list[str],
    code: int,
    words: str,
) -> None:
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7})
    got, _, err = run(
        capsys, "event", "send", *[str(job) if a == "JOB" else a for a in argv], "--dsn", dsn.url
    )
    assert got == code
    assert_one_line_error(got, err, words)
    assert scalar(conn, "SELECT count(*) FROM pgjobs_events") == 0
