"""The batches list, the workflow graph and the search box in a real browser (the fixtures of
``test_browser.py``: Chromium from the OS packages, a real uvicorn server). Their screenshots are
saved as those of ``test_browser.py`` are: with PGJOBS_UPDATE_SCREENSHOTS=1, to docs/screenshots/
for the Dashboard page (batches.png, workflow.png, search.png)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from pgjobs.db.dsn import Dsn
from tests.support.search_rows import insert_keyed

if TYPE_CHECKING:  # Playwright may be missing: test_browser's fixtures then skip, saying why
    from playwright.sync_api import Page

from tests.web.dashboard.test_browser import (  # noqa: F401  (fixtures)
    browser,
    page,
    screenshots,
    server,
    sign_in,
)


def _seed(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """A small ETL workflow (extract, three transforms, a load and a report) and a few batches."""
    extract = insert_keyed(conn, "archived_jobs", tag="customer:42", group="tenant-7")
    transforms = [
        insert_keyed(conn, table, tag="customer:42")
        for table in ("archived_jobs", "dead_letter", "queued_jobs")
    ]
    load = insert_keyed(conn, "queued_jobs", group="tenant-7")
    report = insert_keyed(conn, "queued_jobs")
    conn.execute("UPDATE queued_jobs SET run_at = 'infinity' WHERE id = ANY(%s)", [[load, report]])
    conn.execute(
        "UPDATE queued_jobs SET lease_expires_at = now() + interval '1 minute', "
        "lease_owner = 'web-1:812:7f3a' WHERE id = %s",
        [transforms[2]],
    )
    edges = [(t, extract) for t in transforms] + [(load, t) for t in transforms]
    edges.append((report, load))
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO pgjobs_dependencies VALUES (%s, %s)", edges)
    conn.execute(
        "INSERT INTO pgjobs_batches (total, pending, succeeded, dead, cancelled, callback_task, "
        "callback_queue, completed_at) SELECT 20, CASE WHEN g < 3 THEN 20 - 6 * g ELSE 0 END, "
        "CASE WHEN g < 3 THEN 6 * g ELSE 19 END, CASE WHEN g < 3 THEN 0 ELSE 1 END, 0, "
        "'reports.summarise', 'default', CASE WHEN g >= 3 THEN now() END "
        "FROM generate_series(1, 6) g"
    )
    return {"extract": extract, "load": load}


def test_batches_workflow_and_search_from_the_browser(
    page: Page,  # noqa: F811
    dsn: Dsn,
    screenshots: Callable[..., Path],  # noqa: F811
) -> None:
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        found = _seed(conn)
    sign_in(page, "/batches")
    page.get_by_role("link", name="Batches", exact=True).click()
    assert page.locator("#batches tbody tr").count() == 6
    screenshots(page, "batches", full_page=False)

    page.goto(f"/jobs/{found['load']}")
    workflow = page.locator("#workflow")
    assert workflow.locator("a.wf-node").count() == 6
    assert workflow.locator("a.wf-node[data-status=running]").count() == 1
    workflow.scroll_into_view_if_needed()
    screenshots(page, "workflow")
    workflow.locator(f'a.wf-node[data-job="{found["extract"]}"]').click()
    page.wait_for_url(f"**/jobs/{found['extract']}")

    page.get_by_label("Find a job by id, key, tag or group").fill("customer:42")
    page.get_by_role("button", name="Find", exact=True).first.click()
    page.wait_for_url("**/jobs?find=*")
    assert page.locator("#jobs tbody tr").count() == 4
    screenshots(page, "search", full_page=False)
