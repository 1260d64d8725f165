"""Groups and unique keys on the command line: `pgjobs enqueue --group --unique-key
--on-conflict --debounce`, `pgjobs job show` (wherever the job is), `pgjobs queue limit
--group-concurrency`; bad values are one line, exit 2, and write nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import producer, queues
from pgjobs.submission import JobSpec
from tests.support.factories import insert_dead_raw, insert_raw
from tests.support.helpers import assert_one_line_error, count, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture
def specs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[JobSpec]]:
    """The JobSpecs the command hands to the producer, which then enqueues them as usual."""
    seen: list[JobSpec] = []
    prepare = producer.prepare

    def spy(spec: JobSpec, tasks: Any) -> producer.PreparedJob:
        seen.append(spec)
        return prepare(spec, tasks)

    monkeypatch.setattr(producer, "prepare", spy)
    yield seen


def test_enqueue_passes_group_and_unique_options_to_the_job(capsys, dsn, specs):
    argv = ["enqueue", "t", "--group", "customer-42", "--unique-key", "cart-7"]
    code, out, err = run(
        capsys, *argv, "--on-conflict", "debounce", "--debounce", "30", "--dsn", dsn.url
    )
    assert code == 0, err
    assert int(out.strip()) >= 1
    (spec,) = specs
    assert (spec.group, spec.unique_key, spec.on_conflict, spec.debounce) == (
        "customer-42",
        "cart-7",
        "debounce",
        30.0,
    )
    code, out, err = run(capsys, "enqueue", "t", "--dsn", dsn.url)
    assert code == 0
    assert (specs[1].group, specs[1].unique_key, specs[1].on_conflict, specs[1].debounce) == (
        None,
        None,
        None,
        None,
    )


def test_enqueue_writes_group_and_unique_key_on_the_row(capsys, dsn, conn):
    """The row carries them, and a second enqueue with the key keeps the first job (the
    default): the same id is printed."""
    argv = ["enqueue", "t", "--group", "customer-42", "--unique-key", "cart-7", "--dsn", dsn.url]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    job_id = int(out.strip())
    row = conn.execute(
        "SELECT group_key, unique_key FROM queued_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert row == ("customer-42", "cart-7")
    code, out, _ = run(capsys, *argv)
    assert (code, int(out.strip())) == (0, job_id)
    assert count(conn, "queued_jobs") == 1


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--group", ""], ["group", "non-empty"]),
        (["--group", "x" * 513], ["group", "513 bytes", "512"]),
        (["--group", " padded"], ["group", "space"]),
        (["--unique-key", ""], ["unique_key", "non-empty"]),
        (["--unique-key", "k" * 600], ["unique_key", "600 bytes"]),
        (["--unique-key", "k", "--on-conflict", "merge"], ["on_conflict", "keep, replace"]),
        (["--on-conflict", "replace"], ["on_conflict", "unique_key"]),
        (["--debounce", "5"], ["debounce", "unique_key"]),
        (["--unique-key", "k", "--debounce", "5"], ["debounce", "on_conflict='debounce'"]),
        (
            ["--unique-key", "k", "--on-conflict", "replace", "--debounce", "5"],
            ["debounce", "'replace'"],
        ),
        (
            ["--unique-key", "k", "--on-conflict", "debounce", "--debounce", "-1"],
            ["debounce"],
        ),
        (
            ["--unique-key", "k", "--on-conflict", "debounce", "--debounce", "nan"],
            ["debounce"],
        ),
    ],
)
def test_enqueue_refuses_bad_group_and_unique_options(capsys, dsn, conn, options, words):
    code, _, err = run(capsys, "enqueue", "t", *options, "--dsn", dsn.url)
    assert_one_line_error(code, err, *words)
    assert code == 2
    assert count(conn, "queued_jobs") == 0


def _insert_everywhere(conn: psycopg.Connection[Any]) -> dict[str, int]:
    queued = insert_raw(conn, "t", group_key="customer-42", unique_key="cart-7")
    archived = conn.execute(
        """INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts,
                                      max_attempts, created_at, status, finished_at, group_key,
                                      unique_key)
           VALUES (nextval(pg_get_serial_sequence('queued_jobs', 'id')), 'default', 't', '{}', 0,
                   now(), 1, 1, now(), 'succeeded', now(), 'customer-43', 'cart-8')
           RETURNING id"""
    ).fetchone()
    assert archived is not None
    dead = insert_dead_raw(conn, group_key="customer-44", unique_key="cart-9")
    plain = insert_raw(conn, "t")
    return {"queued": queued, "archived": archived[0], "dead": dead, "plain": plain}


def test_job_show_names_group_and_unique_key_in_each_table(capsys, dsn, conn):
    ids = _insert_everywhere(conn)
    for where, group, key in (
        ("queued", "customer-42", "cart-7"),
        ("archived", "customer-43", "cart-8"),
        ("dead", "customer-44", "cart-9"),
    ):
        code, out, err = run(capsys, "job", "show", str(ids[where]), "--dsn", dsn.url)
        assert code == 0, err
        lines = out.splitlines()
        assert f"  group        {group}" in lines, out
        assert f"  unique key   {key}" in lines, out
        code, out, _ = run(capsys, "job", "show", str(ids[where]), "--json", "--dsn", dsn.url)
        shown = json.loads(out)
        assert (shown["group_key"], shown["unique_key"]) == (group, key)
    code, out, _ = run(capsys, "job", "show", str(ids["plain"]), "--dsn", dsn.url)
    assert "group" not in out and "unique key" not in out
    code, out, _ = run(capsys, "job", "show", str(ids["plain"]), "--json", "--dsn", dsn.url)
    shown = json.loads(out)
    assert (shown["group_key"], shown["unique_key"]) == (None, None)


def test_queue_limit_group_concurrency_set_listed_and_cleared(capsys, dsn, conn):
    code, out, err = run(
        capsys, "queue", "limit", "emails", "--group-concurrency", "2", "--dsn", dsn.url
    )
    assert (code, err) == (0, "")
    assert (
        out.strip() == "queue emails limits set: at most 2 running per group (it holds no job now)"
    )
    assert conn.execute(
        "SELECT group_concurrency FROM pgjobs_queues WHERE name = 'emails'"
    ).fetchone() == (2,)
    # The other limits are kept as they are, and the group concurrency with them.
    code, out, _ = run(capsys, "queue", "limit", "emails", "10", "--json", "--dsn", dsn.url)
    state = json.loads(out)
    assert (state["concurrency"], state["group_concurrency"], state["changed"]) == (10, 2, True)
    code, out, _ = run(capsys, "queue", "list", "--dsn", dsn.url)
    assert "at most 10 running, at most 2 running per group" in out
    code, out, _ = run(capsys, "queue", "list", "--json", "--dsn", dsn.url)
    assert {q["name"]: q["group_concurrency"] for q in json.loads(out)} == {"emails": 2}

    code, out, _ = run(
        capsys, "queue", "limit", "emails", "--group-concurrency", "none", "--dsn", dsn.url
    )
    assert code == 0 and "per group" not in out
    assert queues.queue(dsn, "emails").group_concurrency is None
    assert queues.queue(dsn, "emails").concurrency == 10


@pytest.mark.parametrize(
    ("value", "words"),
    [("0", ["--group-concurrency", "1..1,000,000"]), ("two", ["--group-concurrency", "whole"])],
)
def test_queue_limit_refuses_a_bad_group_concurrency(capsys, dsn, value, words):
    code, _, err = run(
        capsys, "queue", "limit", "emails", "--group-concurrency", value, "--dsn", dsn.url
    )
    assert_one_line_error(code, err, *words)
    assert code == 2
    assert queues.list_queues(dsn) == []


def test_python_api_sets_a_queues_group_concurrency(dsn, make_app):
    from pgjobs.errors import ConfigurationError

    change = make_app().limit_queue("emails", group_concurrency=3)
    assert change.changed and change.queue.group_concurrency == 3 and change.queue.limited
    with pytest.raises(ConfigurationError) as caught:
        queues.limit(dsn, "emails", group_concurrency=0)
    assert caught.value.field == "group_concurrency"
    assert queues.queue(dsn, "emails").group_concurrency == 3


def test_a_queue_of_grouped_jobs_only_is_listed_as_holding_jobs(capsys, dsn, conn):
    """The claim index leaves grouped jobs out: the queue listing finds them by the groups'."""
    insert_raw(conn, "t", queue="tenants", group_key="customer-1")
    assert [(q.name, q.has_jobs) for q in queues.list_queues(dsn)] == [("tenants", True)]
    assert queues.queue(dsn, "tenants").has_jobs
    code, out, _ = run(capsys, "queue", "pause", "tenants", "--dsn", dsn.url)
    assert code == 0 and "holds no job" not in out
