"""Bad input at enqueue: the right pgjobs error, a message naming the problem, nothing written."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import psycopg
import pytest

from pgjobs import (
    App,
    ConfigurationError,
    InvalidPayload,
    JobSpec,
    PgjobsError,
    UnknownTask,
    enqueue,
)
from pgjobs.enqueue import checks
from tests.support.factories import counts

NOTHING = {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}

BAD = [
    pytest.param({"payload": {"when": datetime.now()}}, InvalidPayload, "JSON", id="not-json"),
    pytest.param({"payload": {"x": {1, 2}}}, InvalidPayload, "JSON", id="set-in-payload"),
    pytest.param({"payload": {"x": math.nan}}, InvalidPayload, "JSON", id="nan"),
    pytest.param({"payload": [1, 2]}, InvalidPayload, "dict", id="list-payload"),
    pytest.param({"payload": "text"}, InvalidPayload, "dict", id="str-payload"),
    pytest.param({"payload": {"s": "a\x00b"}}, InvalidPayload, "NUL", id="nul-character"),
    pytest.param({"run_at": datetime(2030, 1, 1)}, ConfigurationError, "timezone", id="naive"),
    pytest.param(
        {"expires_at": datetime(2030, 1, 1)}, ConfigurationError, "timezone", id="naive-exp"
    ),
    pytest.param({"run_in": -1}, ConfigurationError, ">= 0", id="negative-run-in"),
    pytest.param(
        {"run_in": timedelta(seconds=-5)}, ConfigurationError, ">= 0", id="negative-timedelta"
    ),
    pytest.param({"run_in": math.inf}, ConfigurationError, "finite", id="infinite-run-in"),
    pytest.param({"run_in": "10"}, ConfigurationError, "seconds", id="str-run-in"),
    pytest.param(
        {"run_in": 5, "run_at": datetime.now().astimezone()},
        ConfigurationError,
        "not both",
        id="run-at-and-run-in",
    ),
    pytest.param(
        {"expires_in": 5, "expires_at": datetime.now().astimezone()},
        ConfigurationError,
        "not both",
        id="expires-at-and-expires-in",
    ),
    pytest.param({"expires_in": -1}, ConfigurationError, ">= 0", id="negative-expires-in"),
    pytest.param({"max_attempts": 0}, ConfigurationError, "max_attempts", id="max-attempts-0"),
    pytest.param({"max_attempts": -3}, ConfigurationError, "max_attempts", id="max-attempts-neg"),
    pytest.param(
        {"max_attempts": 2.5}, ConfigurationError, "max_attempts", id="max-attempts-float"
    ),
    pytest.param({"priority": 32768}, ConfigurationError, "out of range", id="priority-high"),
    pytest.param({"priority": -32769}, ConfigurationError, "out of range", id="priority-low"),
    pytest.param({"priority": 1.5}, ConfigurationError, "whole number", id="priority-float"),
    pytest.param({"priority": True}, ConfigurationError, "whole number", id="priority-bool"),
    pytest.param({"queue": ""}, ConfigurationError, "queue", id="empty-queue"),
    pytest.param({"queue": "q" * 201}, ConfigurationError, "queue", id="long-queue"),
    pytest.param({"idempotency_key": ""}, ConfigurationError, "idempotency_key", id="empty-key"),
]


@pytest.mark.parametrize(("options", "error", "words"), BAD)
def test_bad_input_raises_and_writes_nothing(make_app, conn, options, error, words):
    app: App = make_app(check_task_names=False)
    payload = options.pop("payload", {"ok": 1})
    with pytest.raises(error, match=words) as raised:
        app.enqueue("t.send", payload, **options)
    assert "\n" not in str(raised.value)
    assert counts(conn) == NOTHING


def test_unknown_task_name_is_refused_when_the_app_registers_tasks(make_app, conn):
    app: App = make_app()

    @app.task(name="t.send")
    def send(to: str) -> None: ...

    with pytest.raises(UnknownTask, match=r"'t\.sned'.*t\.send"):
        app.enqueue("t.sned", {"to": "a"})
    assert counts(conn) == NOTHING
    # The registered name, or the Task object itself, is accepted.
    app.enqueue("t.send", {"to": "a"})
    app.enqueue(send, {"to": "b"})
    assert counts(conn)["queued_jobs"] == 2


def test_empty_task_name_is_refused(make_app, conn):
    app: App = make_app(check_task_names=False)
    with pytest.raises(ConfigurationError, match="task name"):
        app.enqueue("", {})
    assert counts(conn) == NOTHING


def test_payload_over_the_size_limit_is_refused(make_app, conn, monkeypatch):
    monkeypatch.setattr(checks, "MAX_PAYLOAD_BYTES", 64)
    app: App = make_app(check_task_names=False)
    with pytest.raises(InvalidPayload, match="limit is 64"):
        app.enqueue("t.send", {"blob": "x" * 100})
    with pytest.raises(InvalidPayload, match="limit is 64"):
        app.enqueue("t.send", {"blob": "é" * 40})  # 40 characters, 240 bytes as \u escapes
    assert counts(conn) == NOTHING
    app.enqueue("t.send", {"blob": "x" * 10})
    assert counts(conn)["queued_jobs"] == 1


@pytest.mark.parametrize("size", [3, enqueue.COPY_MIN_ROWS + 1], ids=["insert", "copy"])
def test_one_bad_job_in_a_batch_writes_none_of_it(make_app, conn, size):
    app: App = make_app(check_task_names=False)
    specs = [JobSpec("t.send", {"n": n}) for n in range(size)]
    specs[-1] = JobSpec("t.send", {"n": object()})
    with pytest.raises(InvalidPayload, match=f"job #{size - 1}"):
        app.enqueue_many(specs)
    assert counts(conn) == NOTHING


def test_bad_input_inside_the_callers_transaction_leaves_it_usable(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        first = app.enqueue("t.send", {"n": 1}, connection=tx)
        with pytest.raises(PgjobsError):
            app.enqueue("t.send", {"n": 2}, connection=tx, priority=10**6)
        tx.commit()
    assert [r[0] for r in conn.execute("SELECT id FROM queued_jobs").fetchall()] == [first]


@pytest.mark.parametrize("size", [3, enqueue.COPY_MIN_ROWS + 1], ids=["insert", "copy"])
@pytest.mark.parametrize(
    "item",
    [
        ("t.send", {"n": 1}),
        {"task": "t.send"},
        "t.send",
        None,
        JobSpec,
    ],
    ids=["tuple", "dict", "str", "none", "the-class"],
)
def test_an_item_that_is_not_a_jobspec_is_refused_by_position(make_app, conn, size, item):
    app: App = make_app(check_task_names=False)
    specs: list[object] = [JobSpec("t.send", {"n": n}) for n in range(size)]
    specs[1] = item
    with pytest.raises(ConfigurationError, match=r"job #1: expected a JobSpec") as raised:
        app.enqueue_many(specs)  # type: ignore[arg-type]
    assert raised.value.field == "jobs[1]"
    assert counts(conn) == NOTHING


@pytest.mark.parametrize("jobs", [JobSpec("t.send"), "t.send", {"t.send": {}}, 3, None])
def test_jobs_that_are_not_an_iterable_of_jobspecs_are_refused(make_app, conn, jobs):
    app: App = make_app(check_task_names=False)
    with pytest.raises(ConfigurationError, match="iterable of JobSpec") as raised:
        app.enqueue_many(jobs)
    assert raised.value.field == "jobs"
    assert counts(conn) == NOTHING
