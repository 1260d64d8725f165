"""A job waiting ``after`` others keeps an idempotency key, a unique key (each mode) and a group:
the row carries them while it waits, a second enqueue of its key returns it wherever it is, a
replace leaves it waiting, and released it runs in its group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs import App, DependencyFailed, JobSpec, Ref, UnknownDependency
from tests.support.factories import counts, work
from tests.support.helpers import scalar


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.task(name="ok", queue="deps")
    def ok(**payload: Any) -> Any:
        return payload

    @app.task(name="boom", queue="deps", max_attempts=1)
    def boom(**payload: Any) -> None:
        raise RuntimeError("boom")

    return app


def waits(conn: psycopg.Connection[Any], job_id: int) -> bool:
    """Whether job ``job_id`` waits (run_at 'infinity', a pgjobs_waiting row, watched)."""
    found = conn.execute(
        "SELECT q.run_at = 'infinity' AND w.job_id IS NOT NULL AND q.watched"
        " FROM queued_jobs q LEFT JOIN pgjobs_waiting w ON w.job_id = q.id WHERE q.id = %s",
        [job_id],
    ).fetchone()
    return bool(found and found[0])


def value(conn: psycopg.Connection[Any], job_id: int, name: str) -> Any:
    return scalar(conn, f"SELECT {name} FROM queued_jobs WHERE id = %s", [job_id])


def edges(conn: psycopg.Connection[Any]) -> set[tuple[int, int]]:
    return {(a, b) for a, b in conn.execute("SELECT job_id, depends_on FROM pgjobs_dependencies")}


def status(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    found: str | None = scalar(conn, "SELECT status FROM archived_jobs WHERE id = %s", [job_id])
    return found


KEYS: dict[str, tuple[dict[str, Any], str, Any]] = {
    "idempotency_key": ({"idempotency_key": "k"}, "idempotency_key", "k"),
    "unique_key": ({"unique_key": "u"}, "unique_key", "u"),
    "unique_key replace": ({"unique_key": "u", "on_conflict": "replace"}, "unique_key", "u"),
    "unique_key debounce": ({"unique_key": "u", "on_conflict": "debounce"}, "unique_key", "u"),
    "group": ({"group": "g"}, "group_key", "g"),
}


@pytest.mark.parametrize("option", KEYS)
def test_a_waiting_job_carries_its_key_or_group_and_runs_when_released(app, conn, option):
    options, name, expected = KEYS[option]
    first = app.enqueue("ok", {"n": 1})
    job = app.enqueue("ok", {"n": 2}, after=[first], **options)
    assert value(conn, job, name) == expected
    assert waits(conn, job)
    assert edges(conn) == {(job, first)}
    work(app)
    assert status(conn, first) == "succeeded" and status(conn, job) == "succeeded"


@pytest.mark.parametrize("option", ["idempotency_key", "unique_key"])
def test_a_second_enqueue_of_the_key_returns_the_waiting_job_and_adds_nothing(app, conn, option):
    options, _, _ = KEYS[option]
    first = app.enqueue("ok", run_in=3600)
    other = app.enqueue("ok", run_in=3600)
    job = app.enqueue("ok", {"n": 1}, after=[first], **options)
    # Again, with other dependencies or none, alone or in a call: the waiting job, as it is.
    assert app.enqueue("ok", {"n": 2}, after=[other], **options) == job
    assert app.enqueue("ok", {"n": 3}, **options) == job
    ids = app.enqueue_many([JobSpec("ok"), JobSpec("ok", after=[Ref(0)], **options)])
    assert ids[1] == job
    assert edges(conn) == {(job, first)}
    assert scalar(conn, "SELECT payload->>'n' FROM queued_jobs WHERE id = %s", [job]) == "1"
    assert waits(conn, job)


def test_an_idempotency_key_returns_the_first_job_once_it_has_ended(app, conn):
    first = app.enqueue("ok")
    job = app.enqueue("ok", after=[first], idempotency_key="k")
    work(app)
    assert status(conn, job) == "succeeded"
    assert app.enqueue("ok", after=[job], idempotency_key="k") == job
    assert counts(conn)["queued_jobs"] == 0


def test_replacing_a_waiting_job_leaves_it_waiting_with_the_new_payload(app, conn):
    first = app.enqueue("ok", run_in=3600)
    job = app.enqueue("ok", {"n": 1}, after=[first], unique_key="u", on_conflict="replace")
    again = app.enqueue("ok", {"n": 2}, unique_key="u", on_conflict="replace", run_in=60)
    assert again == job and waits(conn, job)
    assert scalar(conn, "SELECT payload->>'n' FROM queued_jobs WHERE id = %s", [job]) == "2"
    # The new run time is the one it takes when released.
    assert scalar(
        conn, "SELECT run_at > now() + interval '50 s' FROM pgjobs_waiting WHERE job_id = %s", [job]
    )


def test_keyed_dependents_chain_with_refs_in_one_call(app, conn):
    """A keyed job after a plain one, a plain one after the keyed one: edges, watched flags and
    waiting counts as for plain jobs, and the chain runs in order."""
    first, keyed, last = app.enqueue_many(
        [
            JobSpec("ok", {"n": 0}),
            JobSpec("ok", {"n": 1}, after=[Ref(0)], group="g", idempotency_key="k"),
            JobSpec("ok", {"n": 2}, after=[Ref(1)]),
        ]
    )
    assert edges(conn) == {(keyed, first), (last, keyed)}
    assert waits(conn, keyed) and waits(conn, last)
    assert value(conn, first, "watched") is True
    work(app)
    finished = conn.execute("SELECT id FROM archived_jobs ORDER BY finished_at, id").fetchall()
    assert [job_id for (job_id,) in finished] == [first, keyed, last]


def test_a_group_member_released_late_takes_its_groups_limit(app, conn):
    """Released, a grouped dependent is a member like any other: the group's row is there."""
    first = app.enqueue("ok")
    job = app.enqueue("ok", after=[first], group="g")
    assert scalar(conn, "SELECT count(*) FROM pgjobs_group_states WHERE group_key = 'g'") == 1
    work(app)
    assert status(conn, job) == "succeeded"


@pytest.mark.parametrize("option", KEYS)
def test_a_refused_dependency_of_a_keyed_job_writes_nothing(app, conn, dsn, option):
    options, _, _ = KEYS[option]
    failed = app.enqueue("boom")
    work(app)
    before = counts(conn)
    with pytest.raises(UnknownDependency, match="no job 55555"):
        app.enqueue("ok", after=[55555], **options)
    with pytest.raises(DependencyFailed, match=f"job {failed} already ended dead"):
        app.enqueue("ok", after=[failed], **options)
    with psycopg.connect(dsn.url) as tx:
        with pytest.raises(UnknownDependency):
            app.enqueue("ok", after=[55555], connection=tx, **options)
        assert tx.execute("SELECT 1").fetchone() == (1,)  # the caller's transaction is usable
    assert counts(conn) == before
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_dependencies") == 0


@pytest.mark.parametrize("option", KEYS)
def test_in_the_callers_transaction_a_keyed_dependent_rolls_back_with_it(app, conn, dsn, option):
    options, _, _ = KEYS[option]
    first = app.enqueue("ok")
    with psycopg.connect(dsn.url) as tx:
        job = app.enqueue("ok", after=[first], connection=tx, **options)
        tx.rollback()
    assert counts(conn)["queued_jobs"] == 1 and edges(conn) == set()
    with psycopg.connect(dsn.url) as tx:
        job = app.enqueue("ok", after=[first], connection=tx, **options)
    assert waits(conn, job) and edges(conn) == {(job, first)}
