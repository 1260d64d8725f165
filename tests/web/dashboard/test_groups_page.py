"""A queue's page shows its groups: how many, how many at their limit (the queue's
group_concurrency, a task's with the server's app), and the groups with the most ready jobs;
the same read as `pgjobs stats` (``pgjobs.groups.load``). Rows inserted with SQL, group_key set;
the job page shows a job's group and unique key."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from fastapi import FastAPI

from pgjobs import App, queues
from pgjobs.db.dsn import Dsn
from tests.support.factories import insert_dead_raw, insert_raw
from tests.web.conftest import TOKEN, TestClient
from tests.web.dashboard.conftest import login


def add(
    conn: psycopg.Connection[Any], group: str, jobs: int, *, task: str = "t", leased: bool = False
) -> None:
    lease = "'w1', '2999-01-01'::timestamptz, 1" if leased else "NULL, NULL, 0"
    conn.execute(
        f"""INSERT INTO queued_jobs (queue, task, payload, group_key, lease_owner,
                                     lease_expires_at, attempts)
            SELECT 'tenants', %s, '{{}}', %s, {lease} FROM generate_series(1, %s)""",
        [task, group, jobs],
    )


def rows(html: str) -> dict[str, list[str]]:
    """The groups table: group -> its cells (ready, running, at its limit, held by)."""
    table = html[html.index('<table class="data" id="groups">') :]
    table = table[: table.index("</table>")]
    found = {}
    for group, body in re.findall(r'<tr data-group="([^"]*)">(.*?)</tr>', table, re.S):
        found[group] = [
            re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
        ]
    return found


def test_the_queue_page_shows_groups_at_their_limit(
    signed_in: TestClient, conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    add(conn, "customer-1", 1200)
    add(conn, "customer-2", 3)
    add(conn, "customer-2", 2, leased=True)
    add(conn, "customer-3", 1, leased=True)
    queues.limit(dsn, "tenants", group_concurrency=2)
    html = signed_in.get("/queues/tenants").text
    summary = html[html.index('id="groups-summary"') :]
    summary = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", summary[: summary.index("</p>")]))
    assert (
        "3 groups with jobs waiting or running; 1 at its limit (at most 2 running per group)"
        in summary
    )
    running = conn.execute(
        "SELECT id FROM queued_jobs WHERE group_key = 'customer-2' AND lease_owner IS NOT NULL"
        " ORDER BY id"
    ).fetchall()
    held = f"2 running jobs: #{running[0][0]}, #{running[1][0]}"
    assert rows(html) == {
        "customer-1": ["1,000+", "0", "no", "-"],
        "customer-2": ["3", "2", "at limit", held],
        "customer-3": ["0", "1", "no", "-"],  # at its limit too, but no ready job to hold
    }
    # The holding jobs link to their pages.
    assert f'<a href="/jobs/{running[0][0]}">#{running[0][0]}</a>' in html
    assert "at most 2 running per group" in html[html.index('id="limits"') :]


def test_a_queue_without_groups_shows_no_groups_section(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    insert_raw(conn, "t", queue="tenants")
    html = signed_in.get("/queues/tenants").text
    assert 'id="groups-title"' not in html


def test_with_the_app_a_tasks_own_limit_counts(
    make_web: Any, conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = App(dsn.url)

    @app.task(name="crm.sync", group_concurrency=1)
    def sync() -> None: ...

    add(conn, "customer-1", 2, task="crm.sync")
    add(conn, "customer-1", 1, task="crm.sync", leased=True)
    web: FastAPI = make_web(app=app)
    with TestClient(web) as client:
        login(client, TOKEN)
        html = client.get("/queues/tenants").text
    assert rows(html)["customer-1"][:3] == ["2", "1", "at limit"]
    assert rows(html)["customer-1"][3].startswith("1 running job: #")
    app.close()


def test_with_the_app_the_page_shows_what_holds_an_ordered_tasks_groups(
    make_web: Any, conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = App(dsn.url)

    @app.task(name="ledger.post", queue="tenants", ordered=True)
    def post() -> None: ...

    @app.task(name="ledger.close", queue="tenants", ordered="hold")
    def close() -> None: ...

    runs = app.enqueue("ledger.post", group="customer-1")
    retries = app.enqueue("ledger.post", group="customer-2")
    for group in ("customer-1", "customer-2", "customer-3"):
        app.enqueue("ledger.post", group=group)
    # The first job of customer-1 runs, that of customer-2 failed and waits for a retry.
    conn.execute(
        "UPDATE queued_jobs SET lease_owner = 'w1', lease_expires_at = now() + interval '1 hour',"
        " attempts = 1, started_at = now() WHERE id = %s",
        [runs],
    )
    conn.execute(
        "UPDATE queued_jobs SET attempts = 1, run_at = now() + interval '1 hour' WHERE id = %s",
        [retries],
    )
    app.enqueue("ledger.close", group="customer-4")
    dead = insert_dead_raw(conn, queue="tenants", task="ledger.close", group_key="customer-4")
    web: FastAPI = make_web(app=app)
    with TestClient(web) as client:
        login(client, TOKEN)
        html = client.get("/queues/tenants").text
    found = rows(html)
    assert found["customer-1"] == ["1", "1", "at limit", f"ledger.post: job #{runs} runs (ordered)"]
    assert found["customer-2"][3].startswith(f"ledger.post: job #{retries} waits for a retry until")
    assert found["customer-3"] == ["1", "0", "no", "-"]
    assert found["customer-4"][3] == (
        f"ledger.close: dead job #{dead}: redrive or purge it to release the group"
    )
    assert f'<a href="/jobs/{dead}">#{dead}</a>' in html
    app.close()


def test_the_job_page_shows_group_and_unique_key(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job = insert_raw(conn, "t", group_key="customer-42", unique_key="cart-7")
    html = signed_in.get(f"/jobs/{job}").text
    assert '<code id="job-group">customer-42</code>' in html
    assert '<code id="job-unique-key">cart-7</code>' in html
    plain = insert_raw(conn, "t")
    assert 'id="job-group"' not in signed_in.get(f"/jobs/{plain}").text
