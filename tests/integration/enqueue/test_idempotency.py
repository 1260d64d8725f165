"""Idempotency keys: a second enqueue with a key returns the holder's id and writes nothing."""

from __future__ import annotations

import threading

import psycopg
import pytest

from pgjobs import JobSpec
from pgjobs.completer.outcomes import Outcomes
from pgjobs.models import DeadReason
from tests.support.factories import claim, counts, row, settle
from tests.support.helpers import assert_one_home, wait_until


def test_second_enqueue_returns_the_same_id_and_creates_no_row(make_app, conn):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.charge", {"order": 1}, idempotency_key="order-1")
    again = app.enqueue("t.charge", {"order": 1}, idempotency_key="order-1")
    # The key wins even when the rest of the submission differs.
    other = app.enqueue("t.refund", {"order": 2}, queue="q2", idempotency_key="order-1")

    assert first == again == other
    assert counts(conn) == {"queued_jobs": 1, "archived_jobs": 0, "dead_letter": 0}
    kept = row(conn, "queued_jobs", first)
    assert kept is not None
    assert (kept["task"], kept["payload"], kept["queue"]) == ("t.charge", {"order": 1}, "default")
    assert kept["idempotency_key"] == "order-1"


def test_different_keys_and_no_key_create_separate_jobs(make_app, conn):
    app = make_app(check_task_names=False)
    ids = [
        app.enqueue("t.charge", {}, idempotency_key="a"),
        app.enqueue("t.charge", {}, idempotency_key="b"),
        app.enqueue("t.charge", {}),
        app.enqueue("t.charge", {}),
    ]
    assert len(set(ids)) == 4
    assert_one_home(conn, ids)


@pytest.mark.parametrize("destination", ["archived_jobs", "dead_letter"])
def test_key_still_held_after_the_job_left_the_hot_table(make_app, conn, destination):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.charge", {"order": 1}, idempotency_key="order-1")
    [job] = claim(conn, owner="w")
    outcomes = Outcomes("w")
    if destination == "archived_jobs":
        outcomes.succeed(job, None)
    else:
        outcomes.bury(job, DeadReason.EXHAUSTED, "ValueError: no", "builtins.ValueError", "tb")
    assert settle(conn, outcomes) == {first}
    assert assert_one_home(conn, [first]) == {first: destination}

    again = app.enqueue("t.charge", {"order": 1}, idempotency_key="order-1")
    assert again == first
    assert counts(conn)["queued_jobs"] == 0, "a finished job's key must not enqueue it again"
    assert_one_home(conn, [first])


def test_duplicates_inside_one_batch_share_one_job(make_app, conn):
    app = make_app(check_task_names=False)
    held = app.enqueue("t.charge", {"n": 0}, idempotency_key="held")
    ids = app.enqueue_many(
        [
            JobSpec("t.charge", {"n": 1}, idempotency_key="k1"),
            JobSpec("t.charge", {"n": 2}, idempotency_key="k2"),
            JobSpec("t.charge", {"n": 3}, idempotency_key="k1"),
            JobSpec("t.charge", {"n": 4}),
            JobSpec("t.charge", {"n": 5}, idempotency_key="held"),
            JobSpec("t.charge", {"n": 6}, idempotency_key="k2"),
        ]
    )
    assert ids[0] == ids[2]
    assert ids[1] == ids[5]
    assert ids[4] == held
    assert len({ids[0], ids[1], ids[3], held}) == 4
    assert counts(conn)["queued_jobs"] == 4
    # The first submission of a key is the one kept.
    first_k1 = row(conn, "queued_jobs", ids[0])
    assert first_k1 is not None and first_k1["payload"] == {"n": 1}
    assert_one_home(conn, [ids[0], ids[1], ids[3], held])


def _backend_waits_on_a_lock(conn: psycopg.Connection) -> bool:
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND application_name = 'pgjobs'"
    ).fetchone()
    return bool(found and found[0])


@pytest.mark.parametrize("holder_commits", [True, False], ids=["commit", "rollback"])
def test_key_held_by_an_uncommitted_enqueue(make_app, dsn, conn, holder_commits):
    """A concurrent enqueue of the same key waits for the holder, then returns its id (commit)
    or creates the job itself (rollback)."""
    app = make_app(check_task_names=False)
    result: list[int] = []
    with psycopg.connect(dsn.url) as tx:
        held = app.enqueue("t.charge", {"who": "tx"}, idempotency_key="k", connection=tx)
        racer = threading.Thread(
            target=lambda: result.append(
                app.enqueue("t.charge", {"who": "racer"}, idempotency_key="k")
            )
        )
        racer.start()
        try:
            wait_until(lambda: _backend_waits_on_a_lock(conn), what="the racer to block on the key")
        finally:
            if holder_commits:
                tx.commit()
            else:
                tx.rollback()
            racer.join(timeout=30)
    assert not racer.is_alive()
    assert len(result) == 1
    assert counts(conn)["queued_jobs"] == 1
    kept = row(conn, "queued_jobs", result[0])
    assert kept is not None
    if holder_commits:
        assert result[0] == held
        assert kept["payload"] == {"who": "tx"}
    else:
        assert result[0] != held
        assert kept["payload"] == {"who": "racer"}
