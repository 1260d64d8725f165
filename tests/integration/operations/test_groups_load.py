"""``pgjobs.groups.load``, the one read behind `pgjobs stats`, the dashboard's queue page and the
``pgjobs_groups_at_limit`` gauge: the top groups by ready jobs, running jobs, which groups are at
their limit (the queue's group_concurrency, a task's when the app is known), and its caps. Rows
are inserted with SQL, group_key set, as any producer leaves them."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import ANY

import psycopg
import pytest

from pgjobs import groups, queries, queues
from pgjobs.models import GroupHold, GroupLoad, HoldReason
from tests.support.factories import declared_task, insert_dead_raw
from tests.support.helpers import run

LEASED = {"lease_owner": "w1", "lease_expires_at": "2999-01-01", "attempts": 1}


def add(
    conn: psycopg.Connection[Any],
    queue: str,
    group: str | None,
    jobs: int,
    *,
    task: str = "t",
    leased: bool = False,
    run_at: str = "now()",
) -> None:
    """``jobs`` queued jobs of ``group`` in one statement (running ones when ``leased``)."""
    lease = "'w1', '2999-01-01'::timestamptz, 1" if leased else "NULL, NULL, 0"
    conn.execute(
        f"""INSERT INTO queued_jobs (queue, task, payload, group_key, run_at, lease_owner,
                                     lease_expires_at, attempts)
            SELECT %s, %s, '{{}}', %s, {run_at}, {lease} FROM generate_series(1, %s)""",
        [queue, task, group, jobs],
    )


def one(
    conn: psycopg.Connection[Any],
    group: str,
    task: str,
    *,
    queue: str = "q",
    leased: bool = False,
    run_at: str = "now()",
    attempts: int = 0,
) -> int:
    """One queued job of ``group``, its id (running when ``leased``)."""
    lease = "'w1', '2999-01-01'::timestamptz" if leased else "NULL, NULL"
    found = conn.execute(
        f"""INSERT INTO queued_jobs (queue, task, payload, group_key, run_at, lease_owner,
                                     lease_expires_at, attempts)
            VALUES (%s, %s, '{{}}', %s, {run_at}, {lease}, %s) RETURNING id""",
        [queue, task, group, attempts],
    ).fetchone()
    assert found is not None
    return int(found[0])


def test_top_groups_running_and_the_queues_limit(conn, dsn):
    add(conn, "tenants", "big", 30)
    add(conn, "tenants", "small", 1)
    add(conn, "tenants", "busy", 2)
    add(conn, "tenants", "busy", 2, leased=True)
    add(conn, "tenants", "later", 5, run_at="now() + interval '1 hour'")
    add(conn, "tenants", "only-running", 1, leased=True)
    add(conn, "tenants", None, 7)  # no group: not a group's job
    add(conn, "other", "x", 1)

    (other, tenants) = groups.load(conn)
    assert (other.queue, other.groups, other.at_limit, other.group_concurrency) == (
        "other",
        1,
        0,
        None,
    )
    assert tenants.groups == 5 and not tenants.groups_capped
    assert tenants.top == (
        GroupLoad("big", 30, False, 0, False),
        GroupLoad("busy", 2, False, 2, False),
        GroupLoad("small", 1, False, 0, False),
        GroupLoad("only-running", 0, False, 1, False),
        GroupLoad("later", 0, False, 0, False),
    )
    assert tenants.at_limit == 0  # no limit anywhere

    queues.limit(dsn, "tenants", group_concurrency=2)
    (_, tenants) = groups.load(conn, top=2)
    assert tenants.group_concurrency == 2
    assert [(g.group_key, g.at_limit) for g in tenants.top] == [("big", False), ("busy", True)]
    assert tenants.at_limit == 1
    queues.limit(dsn, "tenants", group_concurrency=1)
    (_, tenants) = groups.load(conn, top=0)
    assert (tenants.top, tenants.at_limit, tenants.groups) == ((), 2, 5)


def test_a_tasks_own_limit_counts_its_jobs_only(conn):
    add(conn, "q", "a", 3)
    add(conn, "q", "a", 1, task="sync", leased=True)
    add(conn, "q", "b", 1, task="other", leased=True)
    add(conn, "q", "c", 2, task="ordered", leased=True)
    limits = groups.task_limits(
        [
            declared_task("sync", group_concurrency=1),
            declared_task("ordered", ordered=True),
            declared_task("free"),
            declared_task("two", group_concurrency=2),
        ]
    )
    assert limits == {"sync": 1, "ordered": 1, "two": 2}
    (q,) = groups.load(conn, limits=limits)
    assert {g.group_key: g.at_limit for g in q.top} == {"a": True, "b": False, "c": True}
    assert q.at_limit == 2
    # Without the app, only the queue's limit (none here) counts.
    (q,) = groups.load(conn)
    assert q.at_limit == 0


def test_a_big_group_and_many_groups_are_read_within_the_caps(conn):
    add(conn, "big", "whale", 50_000)
    conn.execute(
        """INSERT INTO queued_jobs (queue, task, payload, group_key)
           SELECT 'big', 't', '{}', 'g' || (n % 1000) FROM generate_series(1, 20000) n"""
    )
    conn.execute("ANALYZE queued_jobs")
    (q,) = groups.load(conn, ready_cap=1000, max_groups=1000)
    # 1,001 groups: the count stops at the cap ("1,000+"); "whale" comes after the first 1,000
    # groups in key order, and is shown all the same: the statistics name it the most common.
    assert q.groups_capped and q.groups >= 1000
    assert q.top[0] == GroupLoad("whale", 1000, True, 0, False)
    assert [g.ready for g in q.top[1:]] == [20] * 4
    (q,) = groups.load(conn, max_groups=2000)
    assert (q.groups, q.groups_capped) == (1001, False)
    # Each group's ready jobs are read up to the cap: never the whale's 50,000.
    # The whale's task ordered ("hold"): what holds it is read for the top groups, as boundedly.
    params = {
        "tasks": [],
        "limits": [],
        "ordered_tasks": ["t"],
        "hold_tasks": ["t"],
        "holders": groups.HOLDERS,
        "queue": None,
        "top": 5,
        "ready_cap": 1000,
        "max_groups": 1000,
    }
    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries.GROUPS_LOAD, params).fetchone()
    assert plan is not None
    assert _rows_read(plan[0][0]["Plan"]) < 30_000


def _rows_read(node: dict[str, Any]) -> int:
    """Rows the scans of queued_jobs returned, over every loop."""
    own = 0
    if node.get("Relation Name") == "queued_jobs":
        own = int(node["Actual Rows"] * node["Actual Loops"])
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


def test_stats_shows_the_top_groups_and_those_at_their_limit(capsys, dsn, conn, monkeypatch):
    monkeypatch.delenv("PGJOBS_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    add(conn, "tenants", "customer-1", 1500)
    add(conn, "tenants", "customer-2", 3)
    add(conn, "tenants", "customer-2", 2, leased=True)
    add(conn, "plain", None, 4)
    queues.limit(dsn, "tenants", group_concurrency=2)

    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    assert "groups of tenants: 2 groups, 1 at its limit (at most 2 running per group)" in out
    lines = [line for line in out.splitlines() if "customer-" in line]
    assert "customer-1" in lines[0] and "1,000+" in lines[0]
    assert "customer-2" in lines[1] and "at limit" in lines[1]
    assert "groups of plain" not in out

    code, out, _ = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
    (tenants,) = json.loads(out)["groups"]
    assert tenants["queue"] == "tenants" and tenants["at_limit"] == 1
    assert tenants["top"][0] == {
        "group_key": "customer-1",
        "ready": 1000,
        "ready_capped": True,
        "running": 0,
        "at_limit": False,
        "held_by": [],
    }
    (busy,) = tenants["top"][1]["held_by"]
    assert (busy["reason"], busy["task"], len(busy["job_ids"]), busy["jobs"]) == (
        "limit",
        None,
        2,
        2,
    )


@pytest.mark.usefixtures("no_dsn_in_env")
def test_every_column_of_the_stats_tables_is_named(capsys, dsn, conn):
    # A group at its limit and one not, so that the groups table's every cell is filled.
    add(conn, "tenants", "customer-1", 3)
    add(conn, "tenants", "customer-2", 2)
    add(conn, "tenants", "customer-2", 2, leased=True)
    queues.limit(dsn, "tenants", group_concurrency=2)
    printed = {}
    for argv in (["stats", "--verbose"], ["queue", "list"]):
        code, printed[argv[0]], err = run(capsys, *argv, "--dsn", dsn.url)
        assert code == 0, err
    headers = [line for out in printed.values() for line in out.splitlines() if "┃" in line]
    assert any("group" in line for line in headers), headers
    for line in headers:
        names = [name.strip() for name in line.strip().strip("┃").split("┃")]
        assert all(names), f"a column without a name: {line}"
    cells = {
        cut[1].strip(): [c.strip() for c in cut[2:-1]]
        for cut in (line.split("│") for line in printed["stats"].splitlines())
        if len(cut) > 2 and "customer-" in cut[1]
    }
    assert cells == {"customer-1": ["3", "0", "no", ""], "customer-2": ["2", "2", "at limit", ANY]}


@pytest.mark.parametrize("top", [0, 5])
def test_no_grouped_job_no_row(conn, top):
    add(conn, "plain", None, 3)
    assert groups.load(conn, top=top) == []


def test_stats_with_the_app_counts_a_tasks_own_limit(capsys, dsn, conn, monkeypatch):
    monkeypatch.delenv("PGJOBS_APP", raising=False)
    add(conn, "q", "customer-1", 1, task="cli.limited", leased=True)
    add(conn, "q", "customer-1", 4, task="cli.limited")
    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    assert "groups of q: 1 group, 0 at their limit" in out
    code, out, err = run(
        capsys, "stats", "--app", "tests.integration.groups_app:app", "--dsn", dsn.url
    )
    assert code == 0, err
    assert "groups of q: 1 group, 1 at its limit" in out


def test_stats_uses_only_the_app_it_is_given(capsys, dsn, conn, monkeypatch):
    """$PGJOBS_APP is not read by stats (it imports an app only when given --app): the task's own
    limit is not known, and a module that does not import is no warning."""
    add(conn, "q", "customer-1", 1, task="cli.limited", leased=True)
    add(conn, "q", "customer-1", 4, task="cli.limited")
    monkeypatch.setenv("PGJOBS_APP", "tests.integration.groups_app:app")
    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert "groups of q: 1 group, 0 at their limit" in out
    monkeypatch.setenv("PGJOBS_APP", "no_such_module_here:app")
    assert run(capsys, "stats", "--dsn", dsn.url)[::2] == (0, "")
    code, _, err = run(capsys, "stats", "--app", "no_such_module_here:app", "--dsn", dsn.url)
    assert code == 2 and "cannot import no_such_module_here" in err


def held(conn: psycopg.Connection[Any], **options: Any) -> dict[str, tuple[GroupHold, ...]]:
    """Each top group of queue q, by key: what holds it."""
    (q,) = groups.load(conn, queue="q", **options)
    return {g.group_key: g.held_by for g in q.top}


def test_a_group_at_its_limit_is_held_by_its_running_jobs(conn, dsn):
    running = [one(conn, "busy", "t", leased=True) for _ in range(4)]
    add(conn, "q", "busy", 3)
    add(conn, "q", "free", 1)
    add(conn, "q", "free", 1, leased=True)
    add(conn, "q", "idle", 2, leased=True)  # at its limit, but no ready job to hold
    assert held(conn) == {"busy": (), "free": (), "idle": ()}  # no limit anywhere
    queues.limit(dsn, "q", group_concurrency=2)
    assert held(conn) == {
        "busy": (GroupHold(HoldReason.LIMIT, None, tuple(running[:3]), 4),),
        "free": (),
        "idle": (),
    }


def test_a_tasks_own_limit_is_held_by_that_tasks_running_jobs(conn):
    add(conn, "q", "a", 3, task="sync")
    syncing = one(conn, "a", "sync", leased=True)
    add(conn, "q", "a", 2, task="other", leased=True)  # no limit of its own: holds nothing
    limits = groups.task_limits([declared_task("sync", group_concurrency=1)])
    assert held(conn, limits=limits) == {"a": (GroupHold(HoldReason.LIMIT, None, (syncing,), 1),)}
    assert held(conn) == {"a": ()}  # without the app: the queue's limit only (none)


def test_an_ordered_task_is_held_by_its_oldest_job_when_it_is_not_ready(conn):
    tasks = [declared_task("post", ordered=True)]
    runs = one(conn, "running", "post", leased=True, attempts=1)
    add(conn, "q", "running", 2, task="post")
    retries = one(conn, "retrying", "post", attempts=1, run_at="now() + interval '1 minute'")
    add(conn, "q", "retrying", 2, task="post")
    scheduled = one(conn, "scheduled", "post", run_at="now() + interval '1 hour'")
    add(conn, "q", "scheduled", 1, task="post")
    add(conn, "q", "ready", 3, task="post")  # its oldest is ready: it starts, nothing is held
    # Its oldest job is scheduled, the next too: the group's ready job is another task's.
    one(conn, "later", "post", run_at="now() + interval '1 hour'")
    one(conn, "later", "post", run_at="now() + interval '2 hours'")
    add(conn, "q", "later", 1, task="free")

    found = held(conn, limits=groups.task_limits(tasks), ordered=groups.ordered_tasks(tasks))
    assert found["running"] == (GroupHold(HoldReason.RUNNING, "post", (runs,), 1),)
    ((retry,), (later,)) = found["retrying"], found["scheduled"]
    assert (retry.reason, retry.task, retry.job_ids, retry.jobs) == (
        HoldReason.RETRY,
        "post",
        (retries,),
        1,
    )
    assert (later.reason, later.job_ids) == (HoldReason.SCHEDULED, (scheduled,))
    assert retry.until is not None and later.until is not None and retry.until < later.until
    assert found["ready"] == () and found["later"] == ()
    # Without the app, the ordered tasks are not known: nothing is said to hold them.
    assert set(held(conn).values()) == {()}


def test_a_dead_job_of_a_hold_task_holds_its_group(conn):
    add(conn, "q", "d", 2, task="close")
    dead = insert_dead_raw(conn, queue="q", task="close", group_key="d")
    insert_dead_raw(conn, queue="q", task="close", group_key="elsewhere")
    add(conn, "q", "e", 1, task="close")
    hold = [declared_task("close", ordered="hold")]
    assert groups.ordered_tasks(hold) == {"close": "hold"}
    assert held(conn, ordered=groups.ordered_tasks(hold)) == {
        "d": (GroupHold(HoldReason.DEAD, "close", (dead,), 1),),
        "e": (),
    }
    # ordered=True: a dead job releases its group.
    assert held(conn, ordered=groups.ordered_tasks([declared_task("close", ordered=True)])) == {
        "d": (),
        "e": (),
    }
    # Its oldest job waiting for a retry holds it too, the dead job beside it.
    retries = one(conn, "f", "close", attempts=1, run_at="now() + interval '1 minute'")
    add(conn, "q", "f", 1, task="close")
    dead_f = insert_dead_raw(conn, queue="q", task="close", group_key="f")
    f = held(conn, ordered={"close": "hold"})["f"]
    assert [(h.reason, h.job_ids) for h in f] == [
        (HoldReason.RETRY, (retries,)),
        (HoldReason.DEAD, (dead_f,)),
    ]


def test_a_tasks_limit_and_order_are_shown_across_queues_as_the_claim_counts_them(conn):
    """A task's group limit and order hold per (task, group) in every queue: a group whose
    running jobs, or whose ordered head, are in another queue is at its limit, held by them."""
    tasks = [declared_task("sync", group_concurrency=1), declared_task("post", ordered=True)]
    syncing = one(conn, "a", "sync", queue="east", leased=True, attempts=1)
    add(conn, "q", "a", 2, task="sync")
    head = one(conn, "b", "post", queue="east", leased=True, attempts=1)  # runs in another queue
    add(conn, "q", "b", 2, task="post")
    found = groups.load(
        conn, queue="q", limits=groups.task_limits(tasks), ordered=groups.ordered_tasks(tasks)
    )
    (q,) = found
    loads = {g.group_key: g for g in q.top}
    assert loads["a"].at_limit and loads["a"].running == 0  # its running job is east's
    assert loads["a"].held_by == (GroupHold(HoldReason.LIMIT, None, (syncing,), 1),)
    assert loads["b"].held_by == (GroupHold(HoldReason.RUNNING, "post", (head,), 1),)
