"""Jobs a worker cannot run: unknown task names and payloads that do not fit the handler go to
dead_letter at once, and the worker keeps going."""

from __future__ import annotations

from pgjobs import App
from tests.support.factories import insert_raw, row, work
from tests.support.helpers import assert_one_home


def test_unknown_task_goes_to_dead_letter_and_the_worker_keeps_going(make_app, conn):
    app: App = make_app()
    runs = []

    @app.task(name="t.known")
    def known(n: int) -> None:
        runs.append(n)

    # Another producer (no task registry) enqueues a task this worker's app does not have.
    producer = make_app(check_task_names=False)
    ghost = producer.enqueue("t.ghost", {"n": 0}, priority=10)
    ok_ids = [app.enqueue("t.known", {"n": n}) for n in (1, 2)]

    assert work(app, concurrency=1) == 0

    assert sorted(runs) == [1, 2]
    where = assert_one_home(conn, [ghost, *ok_ids])
    assert where == {ghost: "dead_letter", ok_ids[0]: "archived_jobs", ok_ids[1]: "archived_jobs"}
    dead = row(conn, "dead_letter", ghost)
    assert dead is not None
    assert dead["reason"] == "unknown_task"
    assert dead["task"] == "t.ghost"
    assert "t.ghost" in dead["last_error"]
    assert dead["attempts"] == 1
    assert dead["error_type"] is None and dead["traceback"] is None


def test_payload_not_matching_the_signature_is_invalid_payload(make_app, conn):
    app: App = make_app()
    runs = []

    @app.task(name="t.add")
    def add(a: int, b: int) -> int:
        runs.append((a, b))
        return a + b

    missing = app.enqueue("t.add", {"a": 1})
    extra = app.enqueue("t.add", {"a": 1, "b": 2, "c": 3})
    good = app.enqueue("t.add", {"a": 1, "b": 2})
    not_object = insert_raw(conn, "t.add", "[1, 2]")

    assert work(app) == 0

    assert runs == [(1, 2)]
    where = assert_one_home(conn, [missing, extra, good, not_object])
    assert where == {
        missing: "dead_letter",
        extra: "dead_letter",
        good: "archived_jobs",
        not_object: "dead_letter",
    }
    reasons = dict(conn.execute("SELECT id, reason FROM dead_letter").fetchall())
    assert set(reasons.values()) == {"invalid_payload"}
    missing_row = row(conn, "dead_letter", missing)
    assert missing_row is not None
    assert "t.add" in missing_row["last_error"] and "'b'" in missing_row["last_error"]
    assert "'c'" in row(conn, "dead_letter", extra)["last_error"]  # type: ignore[index]
    assert "JSON object" in row(conn, "dead_letter", not_object)["last_error"]  # type: ignore[index]


def test_handler_taking_kwargs_accepts_any_object_payload(make_app, conn):
    app: App = make_app()
    seen = []

    @app.task(name="t.anything")
    def anything(**fields) -> None:
        seen.append(fields)

    job_id = app.enqueue("t.anything", {"x": 1, "y": [2]})
    assert work(app) == 0
    assert seen == [{"x": 1, "y": [2]}]
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
