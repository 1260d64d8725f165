"""pgjobs.uniqueness without a database: the options of a job with a group or a unique key, how
a batch's jobs of one key are merged, and which statement each kind of job takes."""

from __future__ import annotations

from typing import Any

from pgjobs import App, JobSpec, enqueue, queries, uniqueness
from pgjobs.enqueue import Shape, door


def app_with_tasks() -> App:
    app = App("postgresql://nobody@127.0.0.1:1/nowhere")
    app.task(name="t.debounced", debounce=7)(lambda: None)
    app.task(name="t.throttled", throttle=60)(lambda: None)
    app.task(name="t.plain")(lambda: None)
    return app


def _keys(prepared: enqueue.PreparedJob) -> tuple[object, ...]:
    """A prepared job's group, unique key, on_conflict, debounce and throttle."""
    p = prepared
    return (p.group_key, p.unique_key, p.on_conflict, p.debounce, p.throttle)


def test_options_take_the_tasks_debounce_and_throttle():
    tasks = app_with_tasks().tasks
    debounced = enqueue.prepare(
        JobSpec("t.debounced", unique_key="k", on_conflict="debounce"), tasks
    )
    assert (debounced.unique_key, debounced.on_conflict, debounced.debounce) == ("k", "debounce", 7)
    called = enqueue.prepare(
        JobSpec("t.debounced", unique_key="k", on_conflict="debounce", debounce=2), tasks
    )
    assert called.debounce == 2
    throttled = enqueue.prepare(JobSpec("t.throttled", unique_key="k"), tasks)
    assert (throttled.on_conflict, throttled.throttle) == ("keep", 60)
    # Without a unique key a throttled task's job is not throttled.
    assert _keys(enqueue.prepare(JobSpec("t.throttled", group="g"), tasks)) == (
        "g",
        None,
        None,
        None,
        None,
    )
    plain = enqueue.prepare(JobSpec("t.plain"), tasks)
    assert _keys(plain) == (None,) * 5


def test_a_batch_merges_jobs_of_one_key_as_if_one_after_the_other():
    tasks = app_with_tasks().tasks

    def rows(*modes: str | None) -> list[enqueue.PreparedJob]:
        return [
            enqueue.prepare(JobSpec("t.plain", {"n": n}, unique_key="k", on_conflict=mode), tasks)
            for n, mode in enumerate(modes)
        ]

    assert uniqueness.merged(rows("keep", "keep")) == ([0], [0, 0])
    assert uniqueness.merged(rows("keep", "replace", "keep")) == ([1], [0, 0, 0])
    assert uniqueness.merged(rows("replace", "debounce")) == ([1], [0, 0])
    mixed = [*rows("keep"), enqueue.prepare(JobSpec("t.plain"), tasks), *rows("replace")]
    assert uniqueness.merged(mixed) == ([2, 1], [0, 1, 0])


def statements(rows: list[enqueue.PreparedJob]) -> list[str]:
    """The statement an insert of ``rows`` sends first (on pgjobs' own connection)."""
    plan, _ = door.plan(rows, in_callers_transaction=False, copy=True)
    return [next(plan)[0]]


def test_each_shape_takes_its_statement_and_keyed_jobs_the_keyed_insert():
    tasks = app_with_tasks().tasks
    plain = enqueue.prepare(JobSpec("t.plain"), tasks)
    later = enqueue.prepare(JobSpec("t.plain", run_in=5), tasks)
    grouped = enqueue.prepare(JobSpec("t.plain", group="g"), tasks)
    keyed = enqueue.prepare(JobSpec("t.plain", unique_key="k"), tasks)
    throttled = enqueue.prepare(JobSpec("t.throttled", unique_key="k"), tasks)
    assert [plain.shape, later.shape] == [Shape.READY, Shape.PLAIN]
    assert grouped.shape is keyed.shape is throttled.shape is Shape.KEYED
    assert statements([plain]) == [queries.JOB_INSERT_READY]
    assert statements([later]) == [queries.JOB_INSERT]
    assert statements([plain, later]) == [queries.JOB_INSERT_MANY]
    assert statements([grouped]) == [queries.JOB_INSERT_KEYED]
    assert statements([keyed]) == [queries.JOB_INSERT_KEYED]
    assert statements([plain, grouped]) == [queries.JOB_INSERT_KEYED]
    assert statements([throttled]) == [queries.JOB_THROTTLE_ENSURE]
    big: list[Any] = [plain] * enqueue.COPY_MIN_ROWS
    assert statements(big) == [queries.JOB_RESERVE_IDS]
    assert statements([*big, grouped]) == [queries.JOB_INSERT_KEYED]
    # The statements of jobs without keys name none of the keyed columns.
    for sql in (
        queries.JOB_INSERT,
        queries.JOB_INSERT_READY,
        queries.JOB_INSERT_MANY,
        queries.JOB_INSERT_MANY_READY,
        queries.JOB_COPY_MANY,
    ):
        assert "group_key" not in sql and "unique_key" not in sql


def test_a_batch_gives_a_repeated_idempotency_key_the_first_job():
    tasks = app_with_tasks().tasks
    rows = [
        enqueue.prepare(JobSpec("t.plain", unique_key="a", idempotency_key="i"), tasks),
        enqueue.prepare(
            JobSpec("t.plain", unique_key="b", idempotency_key="i", on_conflict="replace"), tasks
        ),
        enqueue.prepare(JobSpec("t.plain", unique_key="b"), tasks),
    ]
    assert uniqueness.merged(rows) == ([0, 2], [0, 0, 1])
