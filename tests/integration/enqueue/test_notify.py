"""Wake-up: an enqueue NOTIFYs on queries.NOTIFY_CHANNEL with the queue name as payload."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from pgjobs import JobSpec, queries
from pgjobs.enqueue import COPY_MIN_ROWS


@pytest.fixture
def listener(dsn):
    with psycopg.connect(dsn.url, autocommit=True) as listening:
        listening.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queries.NOTIFY_CHANNEL)))
        yield listening


def received(listener, count: int) -> list[str]:
    """The next ``count`` notifications (bounded wait), checking their channel."""
    notes = list(listener.notifies(timeout=5, stop_after=count))
    assert len(notes) == count, f"expected {count} notification(s), got {notes}"
    assert {n.channel for n in notes} == {queries.NOTIFY_CHANNEL}
    return [n.payload for n in notes]


def test_enqueue_notifies_with_the_queue_name(make_app, listener):
    app = make_app(check_task_names=False)
    app.enqueue("t", {}, queue="emails")
    assert received(listener, 1) == ["emails"]
    app.enqueue("t", {})
    assert received(listener, 1) == ["default"]


@pytest.mark.parametrize("size", [4, COPY_MIN_ROWS + 1], ids=["insert", "copy"])
def test_enqueue_many_notifies_each_queue(make_app, listener, size):
    app = make_app(check_task_names=False)
    app.enqueue_many([JobSpec("t", {"n": n}, queue=f"q{n % 2}") for n in range(size)])
    assert sorted(received(listener, 2)) == ["q0", "q1"]
    # Then nothing more: the next notification is the marker's.
    app.enqueue("t", {}, queue="marker")
    assert received(listener, 1) == ["marker"]


def test_enqueue_many_with_keys_notifies(make_app, listener):
    app = make_app(check_task_names=False)
    app.enqueue_many([JobSpec("t", {}, queue="keyed", idempotency_key="k")])
    assert received(listener, 1) == ["keyed"]


def test_notify_is_sent_only_when_the_callers_transaction_commits(make_app, dsn, listener):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        app.enqueue("t", {}, queue="rolled-back", connection=tx)
        tx.rollback()
        app.enqueue("t", {}, queue="committed", connection=tx)
        assert list(listener.notifies(timeout=0.05)) == [], "NOTIFY before commit"
        tx.commit()
    # Notifications arrive in commit order: the first one proves the rollback sent nothing.
    assert received(listener, 1) == ["committed"]


def test_duplicate_idempotency_key_does_not_notify(make_app, listener):
    app = make_app(check_task_names=False)
    app.enqueue("t", {}, queue="first", idempotency_key="k")
    assert received(listener, 1) == ["first"]
    app.enqueue("t", {}, queue="duplicate", idempotency_key="k")
    app.enqueue("t", {}, queue="marker")
    assert received(listener, 1) == ["marker"]
