"""The dashboard's list of batches (``/batches``, in the navigation): newest first, a page at a
time by a keyset on the id (each page starts below the last id of the one before, whatever was
added meanwhile), each batch with its counts, status, callback and a link to its page."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from pgjobs.web.dashboard.frame import PAGE_SIZE
from tests.web.conftest import TestClient


def _listed(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<tr data-batch="(\d+)">', html)]


def _older(html: str) -> str | None:
    found = re.search(r'<a href="(/batches\?before=\d+)" rel="next"', html)
    return found.group(1) if found else None


def _insert(conn: psycopg.Connection[Any], count: int) -> list[int]:
    rows = conn.execute(
        "INSERT INTO pgjobs_batches (total, pending, succeeded, dead, cancelled, callback_task, "
        "callback_queue, completed_at) "
        "SELECT 3, CASE WHEN g %% 2 = 0 THEN 0 ELSE 2 END, CASE WHEN g %% 2 = 0 THEN 2 ELSE 1 END, "
        "CASE WHEN g %% 4 = 0 THEN 1 ELSE 0 END, 0, "
        "CASE WHEN g %% 3 = 0 THEN 'reports.summarise' END, 'default', "
        "CASE WHEN g %% 2 = 0 THEN now() END FROM generate_series(1, %s) g RETURNING id",
        [count],
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_batches_are_listed_newest_first_page_by_page(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    ids = sorted(_insert(conn, 2 * PAGE_SIZE + 7), reverse=True)
    first = signed_in.get("/batches")
    assert first.status_code == 200, first.text
    assert _listed(first.text) == ids[:PAGE_SIZE]
    older = _older(first.text)
    assert older == f"/batches?before={ids[PAGE_SIZE - 1]}"
    # Batches added meanwhile move no batch from one page to the next.
    _insert(conn, 5)
    second = signed_in.get(older)
    assert _listed(second.text) == ids[PAGE_SIZE : 2 * PAGE_SIZE]
    third = signed_in.get(_older(second.text) or "")
    assert _listed(third.text) == ids[2 * PAGE_SIZE :]
    assert _older(third.text) is None
    assert "No batch older than" in signed_in.get(f"/batches?before={min(ids)}").text


def test_a_listed_batch_shows_its_counts_status_callback_and_link(
    signed_in: TestClient, make_app: Any
) -> None:
    app = make_app(check_task_names=False)
    with app.batch(on_complete="reports.summarise") as batch:
        batch.enqueue("reports.render", {"page": 1})
        batch.enqueue("reports.render", {"page": 2})
    html = signed_in.get("/batches").text
    row = html[html.index(f'<tr data-batch="{batch.id}">') :]
    row = row[: row.index("</tr>")]
    assert f'<a href="/batches/{batch.id}">batch {batch.id}</a>' in row
    assert '<td class="num" data-col="total">2</td>' in row
    assert '<td class="num" data-col="pending">2</td>' in row
    assert ">pending</span>" in row and "<code>reports.summarise</code>" in row
    assert signed_in.get(f"/batches/{batch.id}").status_code == 200
    assert 'aria-current="page">Batches</a>' in html


def test_an_empty_list_and_a_bad_cursor(signed_in: TestClient) -> None:
    assert "No batch yet" in signed_in.get("/batches").text
    for bad in ("abc", "-1", "0", "9" * 30, "1 OR 1=1"):
        page = signed_in.get("/batches", params={"before": bad})
        assert page.status_code == 422, bad
        assert "before= is the id of the last batch" in page.text and "Traceback" not in page.text
