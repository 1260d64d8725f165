"""The dashboard's search reads every table through an index: for each kind of search (id,
idempotency key, unique key, tag, group) the plan on the three tables names the index that
``queries`` says it uses, and scans no table sequentially, with sequential scans made costly
(``enable_seqscan = off``) on tables of a few thousand rows.

Asserting no Seq Scan is not enough: without its index, a search ordered by id reads a table by
walking its primary key backward, filtering every row (an Index Scan that reads the whole table);
so each table's plan must name the search's own index."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgjobs import queries
from tests.support.search_rows import fill

#: (query, parameters, for each table an index whose name the plan must hold).
SEARCHES: dict[str, tuple[str, dict[str, Any], tuple[str, str, str]]] = {
    "id": (
        queries.SEARCH_BY_ID,
        {"id": 42},
        ("pk_queued_jobs", "_pkey", "pk_dead_letter"),
    ),
    "idempotency key": (
        queries.JOB_IDS_BY_KEY,
        {"key": "k-3", "limit": 50},
        (
            "uq_queued_jobs_idempotency_key",
            "idempotency_key",  # each partition's index of ix_archived_jobs_idempotency_key
            "ix_dead_letter_idempotency_key",
        ),
    ),
    "unique key": (
        queries.SEARCH_BY_UNIQUE_KEY,
        {"value": "u-4", "limit": 50},
        ("ix_queued_jobs_unique_key", "unique_key_idx", "ix_dead_letter_unique_key"),
    ),
    "tag": (
        queries.SEARCH_BY_TAG,
        {"value": "t-2", "limit": 50},
        ("ix_queued_jobs_tags", "tags_idx", "ix_dead_letter_tags"),
    ),
    "group": (
        queries.SEARCH_BY_GROUP,
        {"value": "g-7", "limit": 50},
        ("ix_queued_jobs_group_sequence", "group_key_idx", "ix_dead_letter_group_key_task"),
    ),
}


def _scans(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each scan of the plan as (node type, relation, index), a bitmap heap scan with the
    indexes of its bitmap's index scans."""
    found = []
    if "Relation Name" in plan:
        index = plan.get("Index Name", "")
        if plan["Node Type"] == "Bitmap Heap Scan":
            index = " ".join(n.get("Index Name", "") for n in _all(plan))
        found.append((plan["Node Type"], plan["Relation Name"], index))
    for child in plan.get("Plans", []):
        found.extend(_scans(child))
    return found


def _all(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_all(child))
    return nodes


@pytest.mark.parametrize("kind", list(SEARCHES))
def test_each_kind_of_search_reads_each_table_by_its_index(
    conn: psycopg.Connection[Any], kind: str
) -> None:
    fill(conn, 3000)
    # The archive's rows land in today's partition (the one the search must read by index).
    query, params, indexes = SEARCHES[kind]
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        row = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    scans = _scans(document[0]["Plan"])
    assert not [s for s in scans if s[0] == "Seq Scan"], scans
    for table, index in zip(("queued_jobs", "archived_jobs", "dead_letter"), indexes, strict=True):
        # Of the archive, the partition that holds the rows (today's) must use the index; its
        # empty partitions are read by whichever index the planner likes (never sequentially).
        used = [s for s in scans if s[1].startswith(table) and index in s[2]]
        assert used, f"{kind}: {table} is not read through {index}: {scans}"
