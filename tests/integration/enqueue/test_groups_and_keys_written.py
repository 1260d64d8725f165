"""Groups written by enqueue (group_key on the row, one pgjobs_group_states row per queue and
group, touched again by each enqueue), and the groups and unique keys refused before anything
is written."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgjobs import ConfigurationError, JobSpec
from pgjobs.enqueue import COPY_MIN_ROWS
from tests.support.factories import counts, row
from tests.support.helpers import scalar


def group_states(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], Any]:
    return {
        (queue, group): touched
        for queue, group, touched in conn.execute(
            "SELECT queue, group_key, touched_at FROM pgjobs_group_states"
        )
    }


def test_a_job_with_a_group_writes_it_and_its_group_row(make_app, conn):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.sync", {"n": 1}, group="customer-42")
    job = row(conn, "queued_jobs", first)
    assert job is not None and (job["group_key"], job["unique_key"]) == ("customer-42", None)
    states = group_states(conn)
    assert list(states) == [("default", "customer-42")]
    second = app.enqueue("t.sync", {"n": 2}, group="customer-42")
    assert second != first
    again = group_states(conn)
    assert list(again) == [("default", "customer-42")]
    assert again["default", "customer-42"] > states["default", "customer-42"]  # written again
    # The same group in another queue is another row; a plain job writes none.
    app.enqueue("t.sync", {"n": 3}, group="customer-42", queue="other")
    app.enqueue("t.sync", {"n": 4})
    assert sorted(group_states(conn)) == [("default", "customer-42"), ("other", "customer-42")]


@pytest.mark.parametrize("size", [3, COPY_MIN_ROWS + 1], ids=["insert", "copy-sized"])
def test_a_batch_writes_one_row_per_queue_and_group(make_app, conn, size):
    app = make_app(check_task_names=False)
    specs = [JobSpec("t.sync", {"n": n}, group=f"g{n % 2}", queue=f"q{n % 3}") for n in range(size)]
    specs.append(JobSpec("t.sync", {"n": -1}))  # a plain job beside them
    ids = app.enqueue_many(specs)
    assert len(set(ids)) == size + 1
    written = dict(conn.execute("SELECT id, group_key FROM queued_jobs").fetchall())
    assert [written[job_id] for job_id in ids] == [spec.group for spec in specs]
    expected = {(spec.queue, spec.group) for spec in specs if spec.group}
    assert set(group_states(conn)) == expected


def test_enqueue_async_writes_the_group_and_the_unique_key(make_app, conn):
    app = make_app(check_task_names=False)

    async def go() -> tuple[int, int]:
        async with app:
            first = await app.enqueue_async("t.sync", {"n": 1}, group="g", unique_key="k")
            again = await app.enqueue_async(
                "t.sync", {"n": 2}, group="g", unique_key="k", on_conflict="replace"
            )
            return first, again

    first, again = asyncio.run(go())
    assert first == again
    job = row(conn, "queued_jobs", first)
    assert job is not None
    assert (job["group_key"], job["unique_key"], job["payload"]) == ("g", "k", {"n": 2})
    assert list(group_states(conn)) == [("default", "g")]


BAD_KEYS = {
    "empty": "",
    "513 bytes": "é" * 256 + "x",
    "NUL": "a\x00b",
    "not a string": 42,
}


@pytest.mark.parametrize("field", ["group", "unique_key"])
@pytest.mark.parametrize("value", list(BAD_KEYS.values()), ids=list(BAD_KEYS))
def test_a_bad_group_or_unique_key_writes_nothing(make_app, conn, field, value):
    app = make_app(check_task_names=False)
    with pytest.raises(ConfigurationError, match=field) as raised:
        app.enqueue("t.sync", {"n": 1}, **{field: value})
    assert raised.value.field == field
    specs = [JobSpec("t.sync", {"n": n}) for n in range(COPY_MIN_ROWS)]
    specs.append(JobSpec("t.sync", {"n": -1}, **{field: value}))
    with pytest.raises(ConfigurationError) as raised:
        app.enqueue_many(specs)
    assert raised.value.field == f"jobs[{COPY_MIN_ROWS}].{field}"
    assert counts(conn)["queued_jobs"] == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_group_states") == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"on_conflict": "replace"}, "on_conflict"),
        ({"debounce": 5}, "debounce"),
        ({"unique_key": "k", "on_conflict": "overwrite"}, "on_conflict"),
        ({"unique_key": "k", "on_conflict": "replace", "debounce": 5}, "debounce"),
        ({"unique_key": "k", "on_conflict": "debounce", "debounce": -1}, "debounce"),
    ],
    ids=[
        "on_conflict without unique_key",
        "debounce without unique_key",
        "unknown on_conflict",
        "debounce with replace",
        "negative debounce",
    ],
)
def test_conflict_options_that_mean_nothing_write_nothing(make_app, conn, options, field):
    app = make_app(check_task_names=False)
    with pytest.raises(ConfigurationError) as raised:
        app.enqueue("t.sync", {"n": 1}, group="g", **options)
    assert raised.value.field == field
    assert "\n" not in str(raised.value)
    assert counts(conn)["queued_jobs"] == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_group_states") == 0
