"""The dashboard's search box (in every page's header, and on the jobs page with a kind): a job
found by id, idempotency key, unique key, tag or group in each of the three tables; a search
that cannot name a job (a NUL, 10 KB of text, an unknown kind) answers 422 with one line and
writes nothing; SQL's metacharacters are only text."""

from __future__ import annotations

import html
import re
from typing import Any

import psycopg
import pytest

from tests.support.search_rows import TABLES, insert_keyed
from tests.web.conftest import TestClient

KINDS = {"key": "key", "unique": "unique", "tag": "tag", "group": "group"}


def _found(html: str) -> set[int]:
    return {int(n) for n in re.findall(r'<tr data-id="(\d+)"', html)}


def _counts(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    return tuple(
        conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
        for t in (*TABLES, "pgjobs_batches")
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_finds_the_jobs_of_every_table(
    signed_in: TestClient, conn: psycopg.Connection[Any], kind: str
) -> None:
    value = f"customer:42/{kind}"
    ids = {table: insert_keyed(conn, table, **{KINDS[kind]: value}) for table in TABLES}
    insert_keyed(conn, "queued_jobs", **{KINDS[kind]: value + "-other"})  # not a prefix match
    for asked in (kind, "any"):
        page = signed_in.get("/jobs", params={"find": value, "kind": asked})
        assert page.status_code == 200, page.text
        assert _found(page.text) == set(ids.values()), asked
    # A search as another kind finds none of them.
    other = "group" if kind != "group" else "tag"
    assert _found(signed_in.get("/jobs", params={"find": value, "kind": other}).text) == set()


def test_one_job_found_is_shown_at_once_by_id_or_by_key(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    for table in TABLES:
        job = insert_keyed(conn, table, unique=f"only-{table}")
        for find, kind in ((f"#{job}", "any"), (str(job), "id"), (f"only-{table}", "unique")):
            answer = signed_in.get(
                "/jobs", params={"find": find, "kind": kind}, follow_redirects=False
            )
            assert answer.status_code == 303 and answer.headers["location"] == f"/jobs/{job}"


@pytest.mark.parametrize(
    ("find", "kind", "says"),
    [
        ("a\x00b", "any", "may not hold a NUL character"),
        ("x" * 10_240, "any", "at most 512 bytes long"),
        ("é" * 257, "tag", "at most 512 bytes long"),  # 514 bytes of UTF-8
        ("   ", "any", "type a job id"),
        ("order-1", "payload", "no kind of search 'payload'"),
    ],
)
def test_a_search_that_cannot_name_a_job_is_refused_in_one_line_and_writes_nothing(
    signed_in: TestClient, conn: psycopg.Connection[Any], find: str, kind: str, says: str
) -> None:
    insert_keyed(conn, "archived_jobs", key="order-1")
    before = _counts(conn)
    page = signed_in.get("/jobs", params={"find": find, "kind": kind})
    assert page.status_code == 422
    error = re.search(r'<p class="flash flash-error" role="alert">([^<]*)</p>', page.text)
    assert error is not None
    line = html.unescape(error.group(1))
    assert says in line and "\n" not in line
    assert "Traceback" not in page.text and "\x00" not in page.text
    assert 'aria-invalid="true"' in page.text or kind == "payload"
    assert _counts(conn) == before


@pytest.mark.parametrize(
    "find",
    ["' OR 1=1 --", "x'; DROP TABLE queued_jobs; --", "%", "_", "*", "\\", '"; --', "{a,b}"],
)
def test_sql_metacharacters_are_only_text(
    signed_in: TestClient, conn: psycopg.Connection[Any], find: str
) -> None:
    for table in TABLES:
        insert_keyed(conn, table, key="k", unique="u", tag="t", group="g")
    holder = insert_keyed(conn, "dead_letter", tag=find, group=find)
    before = _counts(conn)
    page = signed_in.get("/jobs", params={"find": find})
    assert page.status_code == 303 or page.status_code == 200
    found = signed_in.get("/jobs", params={"find": find, "kind": "tag"}, follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"] == f"/jobs/{holder}"
    assert _counts(conn) == before


def test_every_page_has_the_search_box_and_the_batches_link(signed_in: TestClient) -> None:
    for path in ("/", "/dead", "/jobs", "/schedules", "/batches"):
        html = signed_in.get(path).text
        assert 'role="search" aria-label="Search jobs"' in html, path
        assert 'id="top-search" name="find"' in html, path
        assert '<a href="/batches"' in html, path
