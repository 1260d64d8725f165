"""Small factories and checks shared by the integration tests.

Rows are built through the public API where it can build them, and through the same statements
the runtime sends (``pgjobs.queries``) where a test plays a worker by hand.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgjobs import App, Worker, WorkerConfig, cli, db, queries
from pgjobs.completer import Outcomes
from pgjobs.dsn import Dsn
from pgjobs.maintenance import Service
from pgjobs.models import Job

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


def homes(conn: psycopg.Connection[Any]) -> dict[int, str]:
    """Where every job id lives, asserting that none lives in two tables at once."""
    rows = conn.execute(
        "SELECT 'queued_jobs', id FROM queued_jobs"
        " UNION ALL SELECT 'archived_jobs', id FROM archived_jobs"
        " UNION ALL SELECT 'dead_letter', id FROM dead_letter"
    ).fetchall()
    seen = Counter(job_id for _, job_id in rows)
    twice = sorted(job_id for job_id, n in seen.items() if n > 1)
    assert not twice, f"job ids in more than one table: {twice}"
    return {job_id: table for table, job_id in rows}


def assert_one_home(conn: psycopg.Connection[Any], ids: Iterable[int]) -> dict[int, str]:
    """The invariant: every enqueued id is in exactly one of the three tables, and the tables
    hold no other id. Returns where each id is."""
    where = homes(conn)
    expected = set(ids)
    assert set(where) == expected, (
        f"missing: {sorted(expected - set(where))}, unexpected: {sorted(set(where) - expected)}"
    )
    return where


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {
        table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        for table in TABLES
    }


def row(conn: psycopg.Connection[Any], table: str, job_id: int) -> dict[str, Any] | None:
    """One row of ``table`` as a dict, or None."""
    assert table in TABLES
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT * FROM {table} WHERE id = %s", [job_id]).fetchone()


def db_now(conn: psycopg.Connection[Any]) -> Any:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]


def claim(
    conn: psycopg.Connection[Any],
    *,
    owner: str = "fake-worker",
    queues: Sequence[str] = ("default",),
    limit: int = 10,
    lease: float = 300.0,
    at_most_once_tasks: Sequence[str] = (),
) -> list[Job]:
    """Claim like a worker does (``JOB_CLAIM``), without running anything."""
    rows = conn.execute(
        queries.JOB_CLAIM,
        {
            "owner": owner,
            "queues": list(queues),
            "limit": limit,
            "lease": lease,
            "lease_tasks": [],
            "lease_seconds": [],
            "at_most_once_tasks": list(at_most_once_tasks),
        },
    ).fetchall()
    return [db.job_from_row(r) for r in rows]


def settle(conn: psycopg.Connection[Any], outcomes: Outcomes) -> set[int]:
    """Flush ``outcomes`` with ``JOB_SETTLE_MANY``; returns the ids the database applied."""
    params, _ = outcomes.drain()
    return {r[0] for r in conn.execute(queries.JOB_SETTLE_MANY, params).fetchall()}


def work(app: App, **config: Any) -> int:
    """Run a burst worker (no maintenance services) until the app's queues are empty."""
    options: dict[str, Any] = {"burst": True, "poll_interval": 0.02, "maintenance": False}
    options.update(config)
    return Worker(app, WorkerConfig(**options)).run()


def run_service(dsn: Dsn, service: Service) -> dict[str, int]:
    """One ``run_once`` of a maintenance service on a fresh async connection."""

    async def once() -> dict[str, int]:
        aconn = await psycopg.AsyncConnection.connect(dsn.url, autocommit=True)
        try:
            return await service.run_once(aconn)
        finally:
            await aconn.close()

    return asyncio.run(once())


def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds (a bound, not a
    measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def lease_expired(conn: psycopg.Connection[Any], job_id: int) -> Callable[[], bool]:
    def check() -> bool:
        found = conn.execute(
            "SELECT lease_expires_at < now() FROM queued_jobs WHERE id = %s", [job_id]
        ).fetchone()
        return bool(found and found[0])

    return check


def insert_raw(
    conn: psycopg.Connection[Any], task: str, payload_json: str = "{}", **columns: Any
) -> int:
    """Insert a queued_jobs row bypassing enqueue's validation (what another producer, an old
    release or a hand-written SQL INSERT might leave in the queue)."""
    names = ["task", "payload", *columns]
    values = [task, payload_json, *columns.values()]
    placeholders = ", ".join(["%s", "%s::jsonb"] + ["%s"] * len(columns))
    found = conn.execute(
        f"INSERT INTO queued_jobs ({', '.join(names)}) VALUES ({placeholders}) RETURNING id",
        values,
    ).fetchone()
    assert found is not None
    return int(found[0])


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``pgjobs ARGV`` in process: (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code != 0
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith("pgjobs: error: ")
    for word in words:
        assert word in lines[0], lines[0]
