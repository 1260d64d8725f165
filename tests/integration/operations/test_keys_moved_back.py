"""Jobs moved back into queued_jobs (a dead job redriven, a job replayed) keep their group and
their unique key, unless another job of the task not started yet holds the key: then they go in
without it, and the move never fails."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from pgjobs import admin
from pgjobs.admin import DeadFilter
from tests.support.factories import insert_dead_raw, row, work
from tests.support.helpers import assert_one_home, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def holders(conn: psycopg.Connection[Any], key: str) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT id FROM queued_jobs WHERE unique_key = %s AND started_at IS NULL ORDER BY id",
            [key],
        )
    ]


def test_redrive_keeps_a_free_key_and_drops_a_held_one(conn, dsn, make_app):
    app = make_app(check_task_names=False)
    free = insert_dead_raw(conn, task="t.sync", unique_key="free", group_key="g1")
    held = insert_dead_raw(conn, task="t.sync", unique_key="held", group_key="g2")
    twin_a = insert_dead_raw(conn, task="t.sync", unique_key="twin")
    twin_b = insert_dead_raw(conn, task="t.sync", unique_key="twin")
    other_task = insert_dead_raw(conn, task="t.other", unique_key="held")
    holder = app.enqueue("t.sync", {"n": 1}, unique_key="held")

    moved = admin.redrive(dsn, DeadFilter())

    assert moved == 5
    assert_one_home(conn, [free, held, twin_a, twin_b, other_task, holder])
    keys = dict(conn.execute("SELECT id, unique_key FROM queued_jobs").fetchall())
    assert keys == {
        free: "free",
        held: None,  # the enqueued job holds it
        twin_a: "twin",  # the first by id of two that share a key
        twin_b: None,
        other_task: "held",  # another task's key
        holder: "held",
    }
    assert row(conn, "queued_jobs", held)["group_key"] == "g2"  # type: ignore[index]
    assert sorted(r[0] for r in conn.execute("SELECT group_key FROM pgjobs_group_states")) == [
        "g1",
        "g2",
    ]


def test_replay_keeps_a_free_key_and_drops_a_held_one(conn, dsn, make_app):
    app = make_app()
    app.task(name="t.sync")(lambda **_: None)
    done = app.enqueue("t.sync", {"n": 1}, unique_key="k", group="g")
    work(app)
    assert row(conn, "archived_jobs", done) is not None

    copy = admin.replay(dsn, done)
    replayed = row(conn, "queued_jobs", copy)
    assert replayed is not None
    assert (replayed["unique_key"], replayed["group_key"], replayed["replay_of"]) == (
        "k",
        "g",
        done,
    )
    # The copy holds the key: a second replay goes in without it, an enqueue keeps the copy.
    second = admin.replay(dsn, done)
    assert row(conn, "queued_jobs", second)["unique_key"] is None  # type: ignore[index]
    assert app.enqueue("t.sync", {"n": 2}, unique_key="k") == copy
    assert holders(conn, "k") == [copy]
    assert scalar(conn, "SELECT count(*) FROM pgjobs_group_states WHERE group_key = 'g'") == 1


def test_redrive_meets_a_key_taken_while_it_runs_without_failing(conn, dsn, make_app):
    """An enqueue not committed yet holds the key when the redrive checks it: the redrive's
    insert waits for it, finds the key taken, and puts the job back without the key."""
    app = make_app(check_task_names=False)
    dead = insert_dead_raw(conn, task="t.sync", unique_key="race")
    outcome: list[Any] = []
    with psycopg.connect(dsn.url) as tx:
        holder = app.enqueue("t.sync", {"n": 1}, unique_key="race", connection=tx)
        thread = threading.Thread(
            target=lambda: outcome.append(admin.redrive(dsn, DeadFilter(ids=(dead,))))
        )
        thread.start()
        time.sleep(0.5)  # the redrive waits on the uncommitted holder
        assert thread.is_alive()
        tx.commit()
    thread.join(30)
    assert outcome == [1]
    assert row(conn, "queued_jobs", dead)["unique_key"] is None  # type: ignore[index]
    assert holders(conn, "race") == [holder]
