"""``pgjobs.groups.load``, the one read behind `pgjobs stats`, the dashboard's queue page and the
``pgjobs_groups_at_limit`` gauge: the top groups by ready jobs, running jobs, which groups are at
their limit (the queue's group_concurrency, a task's when the app is known), and its caps. Rows
are inserted with SQL, group_key set, as any producer leaves them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgjobs import groups, queries, queues
from pgjobs.models import GroupLoad
from tests.support.factories import declared_task
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
    plan = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + queries.GROUPS_LOAD,
        {"tasks": [], "limits": [], "queue": None, "top": 5, "ready_cap": 1000, "max_groups": 1000},
    ).fetchone()
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
    }


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


def test_stats_warns_when_the_app_named_by_the_environment_cannot_load(capsys, dsn, monkeypatch):
    monkeypatch.setenv("PGJOBS_APP", "no_such_module_here:app")
    code, _, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0
    assert "cannot import no_such_module_here" in err and "queue's group concurrency" in err
    code, _, err = run(capsys, "stats", "--app", "no_such_module_here:app", "--dsn", dsn.url)
    assert code == 2
