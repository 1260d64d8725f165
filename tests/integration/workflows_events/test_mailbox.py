"""Events sent to a workflow job: kept until a wait takes them, and a send that finds the job
waiting makes it ready at once. Sending and waiting lock the job's row first, so neither order
loses an event (proven with two transactions interleaved by hand)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, events
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, InvalidPayload, JobNotFound, JobStateConflict
from pgjobs.models import Job
from tests.support.admin_factories import claim_one, succeed
from tests.support.helpers import count, scalar, wait_until

LATER = datetime.now(UTC) + timedelta(days=30)


def _running(app: App, conn: psycopg.Connection[Any], **options: Any) -> Job:
    job_id = app.enqueue("orders.checkout", {"order": 7}, **options)
    return claim_one(conn, job_id)


def _wait(conn: psycopg.Connection[Any], job: Job, name: str) -> events.Taken | None:
    return events.wait(
        conn,
        job_id=job.id,
        worker="w1",
        attempt=job.attempts,
        name=name,
        deadline=LATER,
    )


def test_an_event_sent_before_the_wait_is_kept_and_taken_once(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    job = _running(app, conn)
    sent = events.send(conn, job.id, "payment_confirmed", {"amount": 1200})
    assert not sent.woke  # nothing waited yet
    taken = _wait(conn, job, "payment_confirmed")
    assert taken is not None and taken.payload == {"amount": 1200}
    assert count(conn, "pgjobs_events") == 0  # taken: it left the mailbox
    # The job kept its lease: it goes on running.
    assert scalar(conn, "SELECT lease_owner FROM queued_jobs WHERE id = %s", [job.id]) == "w1"


def test_a_wait_without_an_event_suspends_the_job_and_a_send_wakes_it(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    job = _running(app, conn)
    assert _wait(conn, job, "shipped") is None
    row = conn.execute(
        "SELECT lease_owner, attempts, run_at FROM queued_jobs WHERE id = %s", [job.id]
    ).fetchone()
    assert row is not None
    assert row[0] is None and row[1] == job.attempts - 1  # slot given back, attempt refunded
    assert row[2] == LATER
    with psycopg.connect(conn.info.dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgjobs"')
        sent = events.send(conn, job.id, "shipped", {"carrier": "ups"})
        notices = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert sent.woke
    assert notices == ["default"]  # idle workers of the queue are told, as for a new job
    ready = scalar(conn, "SELECT run_at <= now() FROM queued_jobs WHERE id = %s", [job.id])
    assert ready
    # Run again: the event is there for the wait.
    again = claim_one(conn, job.id)
    taken = _wait(conn, again, "shipped")
    assert taken is not None and taken.payload == {"carrier": "ups"}
    assert count(conn, "pgjobs_event_waits") == 0


def test_a_send_of_another_name_does_not_wake_the_waiting_job(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    job = _running(app, conn)
    assert _wait(conn, job, "shipped") is None
    assert not events.send(conn, job.id, "refunded").woke
    assert scalar(conn, "SELECT run_at FROM queued_jobs WHERE id = %s", [job.id]) == LATER


def test_events_of_one_name_are_taken_oldest_first(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    job = _running(app, conn)
    for n in range(3):
        events.send(conn, job.id, "tick", n)
    taken = [_wait(conn, job, "tick") for _ in range(3)]
    assert [t.payload for t in taken if t is not None] == [0, 1, 2]


def test_a_send_by_idempotency_key(make_app: Any, conn: psycopg.Connection[Any]) -> None:
    app = make_app()
    job = _running(app, conn, idempotency_key="order-7")
    assert events.send(conn, "order-7", "paid").job_id == job.id


def test_a_send_in_the_callers_transaction_is_undone_with_it(
    make_app: Any, dsn: Dsn, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    job = _running(app, conn)
    with psycopg.connect(dsn.url) as mine:
        events.send(mine, job.id, "paid")
        mine.rollback()
    assert count(conn, "pgjobs_events") == 0


@pytest.mark.parametrize("send_first", [True, False], ids=["send-first", "wait-first"])
def test_neither_order_of_a_racing_send_and_wait_loses_the_event(
    make_app: Any, dsn: Dsn, conn: psycopg.Connection[Any], send_first: bool
) -> None:
    """The first of the two runs in a transaction the test holds open (so it holds the job's
    row lock); the second, in a thread, blocks on that lock until the first commits. Whichever
    is first, the event is either taken by the wait or wakes the job."""
    app = make_app()
    job = _running(app, conn)
    done: dict[str, Any] = {}

    def send(on: psycopg.Connection[Any]) -> None:
        done["sent"] = events.send(on, job.id, "shipped", "ups")

    def wait(on: psycopg.Connection[Any]) -> None:
        done["taken"] = _wait(on, job, "shipped")

    first, second = (send, wait) if send_first else (wait, send)
    with psycopg.connect(dsn.url) as held, psycopg.connect(dsn.url, autocommit=True) as other:
        first(held)  # its transaction stays open: the row stays locked
        thread = threading.Thread(target=second, args=(other,))
        thread.start()
        wait_until(lambda: _blocked(conn), what="the second to block on the job's row lock")
        held.commit()
        thread.join(30)
    if send_first:
        assert done["taken"] is not None and done["taken"].payload == "ups"
        assert not done["sent"].woke
    else:
        assert done["taken"] is None and done["sent"].woke
        assert scalar(conn, "SELECT run_at <= now() FROM queued_jobs WHERE id = %s", [job.id])


def _blocked(conn: psycopg.Connection[Any]) -> bool:
    return bool(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()",
        )
    )


def test_a_stale_attempt_cannot_wait(make_app: Any, conn: psycopg.Connection[Any]) -> None:
    app = make_app()
    job = _running(app, conn)
    conn.execute("UPDATE queued_jobs SET lease_owner = 'w2' WHERE id = %s", [job.id])
    with pytest.raises(JobStateConflict, match="no longer holds"):
        _wait(conn, job, "shipped")
    assert count(conn, "pgjobs_event_waits") == 0


def test_sends_to_unknown_or_ended_jobs_are_refused_and_write_nothing(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    with pytest.raises(JobNotFound, match="no job 999"):
        events.send(conn, 999, "paid")
    with pytest.raises(JobNotFound, match="idempotency key 'nope'"):
        events.send(conn, "nope", "paid")
    job = _running(app, conn)
    succeed(conn, job)
    with pytest.raises(JobStateConflict, match=r"has ended \(succeeded\)"):
        events.send(conn, job.id, "paid")
    assert count(conn, "pgjobs_events") == 0


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("job", "name", "payload", "error", "words"),
    [
        (True, "paid", None, ConfigurationError, "a job id .int. or idempotency key"),
        (0, "paid", None, ConfigurationError, "out of range"),
        (1, "", None, ConfigurationError, "non-empty"),
        (1, "a" * 201, None, ConfigurationError, "limit is 200"),
        (1, "paid\x00", None, ConfigurationError, "event name"),
        (1, "paid", {1, 2}, InvalidPayload, "not JSON"),
        (1, "paid", float("nan"), InvalidPayload, "not JSON"),
        (1, "paid", "x" * 70_000, InvalidPayload, "limit is 65,536"),
        (1, "paid", "a\x00b", InvalidPayload, "NUL"),
        (1, "paid", "\ud800", InvalidPayload, "lone surrogate"),
        (1, "paid", _nested(40), InvalidPayload, "levels deep"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    conn: psycopg.Connection[Any],
    job: Any,
    name: Any,
    payload: Any,
    error: type[Exception],
    words: str,
) -> None:
    with pytest.raises(error, match=words) as raised:
        events.send(conn, job, name, payload)
    assert "\n" not in str(raised.value)
    assert count(conn, "pgjobs_events") == 0


def test_the_sweep_removes_the_mail_of_ended_jobs(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    ended = _running(app, conn)
    events.send(conn, ended.id, "late")
    succeed(conn, ended)
    queued = app.enqueue("orders.checkout", {"order": 8})
    events.send(conn, queued, "kept")
    assert events.sweep(conn) == 1
    assert scalar(conn, "SELECT job_id FROM pgjobs_events") == queued
