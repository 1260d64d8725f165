"""Jobs with every key the dashboard's search finds (id, idempotency key, unique key, tag,
group), one in each of the three tables, written as rows (the search reads rows, whatever put
them there); and filler rows without keys, so that a planner has a reason to use an index."""

from __future__ import annotations

from typing import Any

import psycopg

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")

_COLUMNS = "id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at"
_EXTRA = {
    "queued_jobs": ("", ""),
    "archived_jobs": (", status, finished_at", ", 'succeeded', now()"),
    "dead_letter": (", reason, failed_at", ", 'exhausted', now()"),
}


def insert_keyed(
    conn: psycopg.Connection[Any],
    table: str,
    *,
    key: str | None = None,
    unique: str | None = None,
    tag: str | None = None,
    group: str | None = None,
) -> int:
    """One job in ``table`` with these keys; its id."""
    names, values = _EXTRA[table]
    row = conn.execute(
        f"INSERT INTO {table} ({_COLUMNS}, idempotency_key, unique_key, tags, group_key{names}) "
        "VALUES (nextval(pg_get_serial_sequence('queued_jobs', 'id')), 'search', 'search.task', "
        "'{}', 0, now(), 0, 5, now(), %s, %s, %s, %s" + values + ") RETURNING id",
        [key, unique, [tag] if tag else None, group],
    ).fetchone()
    assert row is not None
    return int(row[0])


def fill(conn: psycopg.Connection[Any], rows: int) -> None:
    """``rows`` jobs in each table, some with keys (others' keys), then ANALYZE."""
    for table in TABLES:
        names, values = _EXTRA[table]
        conn.execute(
            f"INSERT INTO {table} ({_COLUMNS}, idempotency_key, unique_key, tags, group_key{names}) "
            "SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id')), 'filler', 'filler.task', "
            "'{}', 0, now(), 0, 5, now(), "
            "CASE WHEN g %% 3 = 0 THEN 'k-' || g END, CASE WHEN g %% 3 = 1 THEN 'u-' || g END, "
            "CASE WHEN g %% 2 = 0 THEN ARRAY['t-' || g %% 500] END, "
            "CASE WHEN g %% 2 = 1 THEN 'g-' || g %% 500 END" + values + " "
            "FROM generate_series(1, %s) g",
            [rows],
        )
    conn.execute("ANALYZE queued_jobs, archived_jobs, dead_letter")
