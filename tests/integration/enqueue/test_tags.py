"""Tags: checked at the door, written by every insert path (one job, unnest, COPY, keyed), kept
through the archive, the dead letter, a redrive and a replay; untagged jobs keep their
statements."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from pgjobs import App, ConfigurationError, JobSpec, admin, copying, enqueue, queries
from pgjobs.enqueue import Shape, door
from tests.support.factories import counts, work

NOTHING = {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}

BAD = [
    pytest.param("customer:42", "a string", id="bare-string"),
    pytest.param(b"customer", "a string", id="bytes"),
    pytest.param({"customer:42"}, "list of strings", id="set"),
    pytest.param(42, "list of strings", id="number"),
    pytest.param(["ok", 7], r"tags\[1\] must be a string", id="not-a-string"),
    pytest.param([""], "empty", id="empty-tag"),
    pytest.param(["x" * 101], "limit is 100", id="too-long"),
    pytest.param(["a\x00b"], "NUL", id="nul"),
    pytest.param(["a\nb"], "control character", id="newline"),
    pytest.param(["a\u200bb"], "format character", id="zero-width-space"),
    pytest.param([" padded"], "begins or ends with a space", id="leading-space"),
    pytest.param([f"t{n}" for n in range(21)], "the limit is 20", id="too-many"),
]


@pytest.mark.parametrize(("tags", "words"), BAD)
def test_bad_tags_are_refused_in_one_line_and_nothing_is_written(make_app, conn, tags, words):
    app: App = make_app(check_task_names=False)
    with pytest.raises(ConfigurationError, match=words) as raised:
        app.enqueue("t.send", {}, tags=tags)
    assert "\n" not in str(raised.value)
    assert raised.value.field is not None and raised.value.field.startswith("tags")
    with pytest.raises(ConfigurationError, match=words):
        app.enqueue_many([JobSpec("t.send"), JobSpec("t.send", tags=tags)])
    assert counts(conn) == NOTHING


def _tags(conn: psycopg.Connection[Any], job_id: int, table: str = "queued_jobs") -> Any:
    found = conn.execute(f"SELECT tags FROM {table} WHERE id = %s", [job_id]).fetchone()
    assert found is not None, f"job {job_id} is not in {table}"
    return found[0]


def test_one_job_keeps_its_tags_in_order_without_duplicates(make_app, conn):
    app: App = make_app(check_task_names=False)
    tagged = app.enqueue("t.send", {}, tags=["customer:42", "import:7", "customer:42"])
    plain = app.enqueue("t.send", {})
    empty = app.enqueue("t.send", {}, tags=[])
    scheduled = app.enqueue("t.send", {}, tags=("later",), run_in=3600, priority=3)
    assert _tags(conn, tagged) == ["customer:42", "import:7"]
    assert _tags(conn, plain) is None and _tags(conn, empty) is None
    assert _tags(conn, scheduled) == ["later"]
    # In NFC, as a filter typed either way compares.
    decomposed = app.enqueue("t.send", {}, tags=["cafe\u0301"])
    assert _tags(conn, decomposed) == ["caf\u00e9"]


def test_enqueue_async_writes_tags(make_app, conn):
    app: App = make_app(check_task_names=False)

    async def enqueue() -> int:
        try:
            return await app.enqueue_async("t.send", {}, tags=["a", "b"])
        finally:
            await app.aclose()

    assert _tags(conn, asyncio.run(enqueue())) == ["a", "b"]


@pytest.mark.parametrize("size", [3, enqueue.COPY_MIN_ROWS + 2], ids=["unnest", "copy"])
def test_a_batch_writes_each_jobs_tags(make_app, conn, size):
    app: App = make_app(check_task_names=False)
    specs = [
        JobSpec("t.send", {"n": n}, tags=[f"n:{n}", "batch"] if n % 2 else None)
        for n in range(size)
    ]
    specs[0] = specs[0]._replace(run_in=60, idempotency_key=None)
    ids = app.enqueue_many(specs)
    for n, job_id in enumerate(ids):
        assert _tags(conn, job_id) == ([f"n:{n}", "batch"] if n % 2 else None)


def test_tags_with_an_idempotency_key(make_app, conn):
    app: App = make_app(check_task_names=False)
    first = app.enqueue("t.send", {}, idempotency_key="k1", tags=["first"])
    again = app.enqueue("t.send", {}, idempotency_key="k1", tags=["second"])
    assert first == again
    assert _tags(conn, first) == ["first"]


def test_keyed_jobs_carry_tags_and_replace_takes_the_new_ones(make_app, conn):
    app: App = make_app(check_task_names=False)
    grouped = app.enqueue("t.send", {}, group="tenant-1", tags=["tenant:1"])
    assert _tags(conn, grouped) == ["tenant:1"]
    held = app.enqueue("t.send", {"v": 1}, unique_key="u", tags=["old"])
    kept = app.enqueue("t.send", {"v": 2}, unique_key="u", tags=["ignored"])
    assert kept == held and _tags(conn, held) == ["old"]
    replaced = app.enqueue("t.send", {"v": 3}, unique_key="u", on_conflict="replace", tags=["new"])
    assert replaced == held and _tags(conn, held) == ["new"]
    # A replace without tags leaves the holder's, as it leaves its trace context.
    app.enqueue("t.send", {"v": 4}, unique_key="u", on_conflict="replace")
    assert _tags(conn, held) == ["new"]
    # In one batch, the last replace stands for the others.
    ids = app.enqueue_many(
        [
            JobSpec("t.send", {"v": 5}, unique_key="w", tags=["w1"]),
            JobSpec("t.send", {"v": 6}, unique_key="w", on_conflict="replace", tags=["w2"]),
            JobSpec("t.send", {"v": 7}, group="g", tags=["g"]),
        ]
    )
    assert ids[0] == ids[1]
    assert _tags(conn, ids[0]) == ["w2"] and _tags(conn, ids[2]) == ["g"]


def test_tagged_jobs_take_the_statements_of_their_shape():
    def statements(rows: list[enqueue.PreparedJob]) -> list[str]:
        plan, _ = door.plan(rows, in_callers_transaction=False, copy=True)
        return [next(plan)[0]]

    plain = enqueue.prepare(JobSpec("t.send"), None)
    assert statements([plain]) == [queries.JOB_INSERT_READY]
    assert statements([plain, plain]) == [queries.JOB_INSERT_MANY_READY]
    idempotent = enqueue.prepare(JobSpec("t.send", idempotency_key="i"), None)
    assert statements([plain, idempotent]) == [queries.JOB_INSERT_KEYED]
    keyed = enqueue.prepare(JobSpec("t.send", unique_key="k"), None)
    assert statements([keyed]) == [queries.JOB_INSERT_KEYED]
    tagged = enqueue.prepare(JobSpec("t.send", tags=["a"]), None)
    assert tagged.shape is Shape.PLAIN
    assert statements([tagged]) == [queries.JOB_INSERT]
    assert statements([plain, tagged]) == [queries.JOB_INSERT_MANY]
    keyed_tagged = enqueue.prepare(JobSpec("t.send", unique_key="k", tags=["a"]), None)
    assert statements([keyed_tagged, plain]) == [queries.JOB_INSERT_KEYED]
    now = datetime.now(UTC)
    assert copying.copy_rows([plain] * 2, now, [1, 2], ready=True)[0] == queries.JOB_COPY_MANY_READY
    assert copying.copy_rows([plain, tagged], now, [1, 2], ready=False)[0] == queries.JOB_COPY_MANY


def test_tags_travel_to_the_archive_the_dead_letter_and_back(make_app, conn, dsn):
    app: App = make_app()

    @app.task(name="t.ok")
    def ok() -> None: ...

    @app.task(name="t.boom", max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    done = app.enqueue("t.ok", {}, tags=["customer:42"])
    dead = app.enqueue("t.boom", {}, tags=["customer:42", "import:7"])
    other = app.enqueue("t.boom", {}, tags=["customer:43"])
    work(app)
    assert _tags(conn, done, "archived_jobs") == ["customer:42"]
    assert _tags(conn, dead, "dead_letter") == ["customer:42", "import:7"]
    assert admin.job(dsn, dead).tags == ("customer:42", "import:7")
    assert admin.dead_job(dsn, dead).tags == ("customer:42", "import:7")
    # Replays keep the tags (of an archived and of a dead job).
    copy = app.replay(done)
    assert _tags(conn, copy) == ["customer:42"]
    dead_copy = app.replay(dead)
    assert _tags(conn, dead_copy) == ["customer:42", "import:7"]
    # A redrive by tag takes the jobs carrying every tag given, and keeps them.
    assert app.redrive(tags=["customer:42", "nope"]) == 0
    assert app.redrive(tags=["import:7", "customer:42"]) == 1
    assert _tags(conn, dead) == ["customer:42", "import:7"]
    assert _tags(conn, other, "dead_letter") == ["customer:43"]
    with pytest.raises(ConfigurationError, match="a string"):
        app.redrive(tags="customer:43")
