"""The job page's workflow graph: the jobs a job's dependency edges reach in either direction,
drawn by the server as an SVG (no script), each box a link to its job with a title and a text
label, coloured by its status; at most ``graph.DRAWN`` jobs, the page saying how many more."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from pgjobs.web.dashboard import graph
from tests.support.search_rows import insert_keyed
from tests.web.conftest import TestClient


def _depend(conn: psycopg.Connection[Any], edges: list[tuple[int, int]]) -> None:
    """``edges`` as (job, the job it depends on)."""
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO pgjobs_dependencies VALUES (%s, %s)", edges)


def _drawn(html: str) -> dict[int, str]:
    return {
        int(job): status
        for job, status in re.findall(r'data-job="(\d+)" data-status="([a-z]+)"', html)
    }


def test_a_diamond_is_drawn_with_each_job_linked_titled_and_coloured(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    extract = insert_keyed(conn, "archived_jobs")
    left = insert_keyed(conn, "dead_letter")
    right = insert_keyed(conn, "queued_jobs")
    load = insert_keyed(conn, "queued_jobs")
    conn.execute("UPDATE queued_jobs SET run_at = 'infinity' WHERE id = %s", [load])
    pruned = 10**12  # a dependent no table keeps any longer
    _depend(conn, [(left, extract), (right, extract), (load, left), (load, right), (pruned, load)])
    unrelated = insert_keyed(conn, "queued_jobs")
    _depend(conn, [(10**12 + 1, unrelated)])

    html = signed_in.get(f"/jobs/{right}").text
    assert 'id="workflow"' in html and "<script" not in html.split('id="workflow"')[1][:20000]
    assert _drawn(html) == {
        extract: "succeeded",
        left: "dead",
        right: "ready",
        load: "waiting",
        pruned: "gone",
    }
    for job in (extract, left, right, load, pruned):
        assert f'<a href="/jobs/{job}" class="wf-node' in html
    assert f"<title>Job {left} (search.task): dead</title>" in html
    assert f"<title>Job {pruned}: no longer kept (pruned)</title>" in html
    assert f">#{load} search.task</text>" in html
    assert f'data-job="{right}" data-status="ready" aria-current="page"' in html
    assert 'class="wf-node wf-succeeded"' in html and 'class="wf-node wf-dead"' in html
    assert "5 jobs in 4 steps" in html and 'id="workflow-more"' not in html
    # The same workflow from any of its jobs; none for a job without edges.
    assert set(_drawn(signed_in.get(f"/jobs/{extract}").text)) == set(_drawn(html))
    alone = insert_keyed(conn, "queued_jobs")
    assert 'id="workflow"' not in signed_in.get(f"/jobs/{alone}").text


def test_past_the_bound_the_nearest_jobs_are_drawn_and_the_rest_counted(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    fan = insert_keyed(conn, "archived_jobs")
    dependents = [insert_keyed(conn, "queued_jobs") for _ in range(graph.DRAWN + 49)]
    _depend(conn, [(d, fan) for d in dependents])
    html = signed_in.get(f"/jobs/{fan}").text
    assert len(_drawn(html)) == graph.DRAWN
    more = re.search(r'<strong id="workflow-more">([^<]*)</strong>', html)
    assert more is not None and more.group(1) == "50 more jobs of this workflow are not drawn"


def test_a_workflow_past_what_is_read_says_more_than(
    signed_in: TestClient, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graph, "DRAWN", 10)
    monkeypatch.setattr(graph, "REACHED", 20)
    chain = [insert_keyed(conn, "queued_jobs") for _ in range(30)]
    _depend(conn, list(zip(chain[1:], chain, strict=False)))
    html = signed_in.get(f"/jobs/{chain[0]}").text
    # The nearest ten: the job and the next nine of the chain.
    assert set(_drawn(html)) == set(chain[:10])
    assert "More than 10 more jobs of this workflow are not drawn" in html
