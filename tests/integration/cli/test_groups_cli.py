"""Groups and unique keys on the command line: `pgjobs enqueue --group --unique-key
--on-conflict --debounce`, `pgjobs job show` (wherever the job is), `pgjobs queue limit
--group-concurrency`, what holds a group in `pgjobs stats`; bad values are one line, exit 2, and
write nothing."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgjobs import queues
from tests.support.factories import insert_dead_raw, insert_raw
from tests.support.helpers import assert_one_line_error, count, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


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


def _job(conn: psycopg.Connection[Any], group: str, task: str, **columns: Any) -> int:
    """A queued job of ``group`` in queue q, and its group's row, as the enqueue writes them."""
    conn.execute(
        """INSERT INTO pgjobs_group_states (queue, group_key) VALUES ('q', %s)
           ON CONFLICT (queue, group_key) DO UPDATE SET touched_at = clock_timestamp()""",
        [group],
    )
    return insert_raw(conn, task, queue="q", group_key=group, **columns)


def test_stats_shows_what_holds_each_group(capsys, dsn, conn, monkeypatch):
    monkeypatch.delenv("PGJOBS_APP", raising=False)
    lease = {"lease_owner": "w1", "lease_expires_at": "2999-01-01", "attempts": 1}
    runs = _job(conn, "c-1", "cli.ordered", **lease)
    _job(conn, "c-1", "cli.ordered")
    retries = _job(conn, "c-2", "cli.ordered", attempts=1, run_at="2999-01-01")
    _job(conn, "c-2", "cli.ordered")
    _job(conn, "c-3", "cli.held")
    dead = insert_dead_raw(conn, task="cli.held", group_key="c-3")
    limited = _job(conn, "c-4", "cli.limited", **lease)
    _job(conn, "c-4", "cli.limited")
    app = ["--app", "tests.integration.groups_app:app"]

    code, out, err = run(capsys, "stats", *app, "--dsn", dsn.url)
    assert code == 0, err
    lines = {line.split()[1]: line for line in out.splitlines() if " c-" in line}
    assert f"cli.ordered: job {runs} runs (ordered)" in lines["c-1"]
    assert f"cli.ordered: job {retries} waits for a retry at 2999-01-01 00:00" in lines["c-2"]
    assert f"cli.held: dead job {dead} (redrive or purge it" in lines["c-3"]
    assert f"1 running job: {limited}" in lines["c-4"]

    code, out, err = run(capsys, "stats", *app, "--json", "--verbose", "--dsn", dsn.url)
    assert code == 0, err
    (q,) = json.loads(out)["groups"]
    held = {g["group_key"]: g["held_by"] for g in q["top"]}
    assert held["c-1"] == [
        {
            "reason": "running",
            "task": "cli.ordered",
            "job_ids": [runs],
            "jobs": 1,
            "until": None,
            "rate": None,
        }
    ]
    assert held["c-2"] == [
        {
            "reason": "retry",
            "task": "cli.ordered",
            "job_ids": [retries],
            "jobs": 1,
            "until": "2999-01-01T00:00:00+00:00",
            "rate": None,
        }
    ]
    assert [(h["reason"], h["job_ids"]) for h in held["c-3"]] == [("dead", [dead])]
    assert [(h["reason"], h["job_ids"]) for h in held["c-4"]] == [("limit", [limited])]

    # Without the app, the ordered tasks and the task's limit are not known: nothing is held.
    code, out, err = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
    (q,) = json.loads(out)["groups"]
    assert [g["held_by"] for g in q["top"]] == [[], [], [], []]
