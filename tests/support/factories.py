"""Small factories and checks shared by the integration tests.

Rows are built through the public API where it can build them, and through the same statements
the runtime sends (``pgjobs.queries``) where a test plays a worker by hand. Waiting, the
three-table invariant and running the CLI are in ``tests/support/helpers.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgjobs import App, Worker, WorkerConfig, db, queries
from pgjobs.completer import ClaimParams, ClaimStatus
from pgjobs.completer.outcomes import Outcomes
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance import R, Service
from pgjobs.models import Job
from pgjobs.tasks import Task, make_task
from tests.support.helpers import TABLES, scalar


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows in each of the three tables."""
    return {table: scalar(conn, f"SELECT count(*) FROM {table}") for table in TABLES}


def row(conn: psycopg.Connection[Any], table: str, job_id: int) -> dict[str, Any] | None:
    """One row of ``table`` as a dict, or None."""
    assert table in TABLES
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT * FROM {table} WHERE id = %s", [job_id]).fetchone()


def db_now(conn: psycopg.Connection[Any]) -> Any:
    return scalar(conn, "SELECT clock_timestamp()")


def claim(
    conn: psycopg.Connection[Any],
    *,
    owner: str = "fake-worker",
    queues: Sequence[str] = ("default",),
    limit: int = 10,
    lease: float = 300.0,
    at_most_once_tasks: Sequence[str] = (),
    external_tasks: Sequence[str] = (),
) -> list[Job]:
    """Claim like a worker does (``JOB_CLAIM``), without running anything; the jobs of
    ``external_tasks`` as a worker that delivers them to a downstream."""
    params = ClaimParams(
        owner,
        list(queues),
        lease=lease,
        at_most_once_tasks=list(at_most_once_tasks),
        external_tasks=list(external_tasks),
    )
    rows = conn.execute(queries.JOB_CLAIM, params.bind(limit)).fetchall()
    return [db.job_from_row(r) for r in rows if r[0] is not None]  # not the status row


def claim_limited(
    conn: psycopg.Connection[Any],
    tasks: Sequence[Task] = (),
    *,
    owner: str = "fake-worker",
    queues: Sequence[str] = ("default",),
    limit: int = 10,
) -> tuple[list[Job], ClaimStatus]:
    """Claim like a worker that runs ``tasks`` (their limits) does (``JOB_CLAIM_LIMITED``),
    without running anything; returns the jobs and the claim's status."""
    params = ClaimParams.for_tasks(owner, queues, tasks)
    rows = conn.execute(queries.JOB_CLAIM_LIMITED, params.bind(limit, limited=True)).fetchall()
    assert rows and rows[-1][0] is None, "the limited claim ends with its status row"
    return [db.job_from_row(r) for r in rows[:-1]], ClaimStatus.of(rows[-1][3])


def settle(conn: psycopg.Connection[Any], outcomes: Outcomes) -> set[int]:
    """Flush ``outcomes`` with ``JOB_SETTLE_MANY``; returns the ids the database applied."""
    params = outcomes.drain().bind()
    return {r[0] for r in conn.execute(queries.JOB_SETTLE_MANY, params).fetchall()}


def work(app: App, **config: Any) -> int:
    """Run a burst worker (no maintenance services) until the app's queues are empty."""
    options: dict[str, Any] = {"burst": True, "poll_interval": 0.02, "maintenance": False}
    options.update(config)
    return Worker(app, WorkerConfig(**options)).run()


def run_service(dsn: Dsn, service: Service[R]) -> R:
    """One ``run_once`` of a maintenance service on a fresh async connection."""

    async def once() -> R:
        aconn = await psycopg.AsyncConnection.connect(dsn.url, autocommit=True)
        try:
            return await service.run_once(aconn)
        finally:
            await aconn.close()

    return asyncio.run(once())


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


def insert_dead_raw(conn: psycopg.Connection[Any], **columns: Any) -> int:
    """A dead_letter row inserted by SQL, as a dump or another program may leave it (the
    values, ``columns`` over defaults, as PostgreSQL takes them in text)."""
    found = conn.execute("SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id'))").fetchone()
    assert found is not None
    values = {
        "id": found[0],
        "queue": "default",
        "task": "t.gone",
        "payload": "{}",
        "priority": 0,
        "run_at": "2026-01-01",
        "attempts": 1,
        "max_attempts": 1,
        "created_at": "2026-01-01",
        "reason": "exhausted",
        "last_error": "ValueError: no",
        "failed_at": "2026-01-02",
        **columns,
    }
    names = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    found = conn.execute(
        f"INSERT INTO dead_letter ({names}) VALUES ({marks}) RETURNING id", list(values.values())
    ).fetchone()
    assert found is not None
    return int(found[0])


def declared_task(name: str, **options: Any) -> Task:
    """A task as a worker's code would declare it (a handler that does nothing), for the claims
    that tests play by hand; ``options`` as ``@app.task`` takes them."""
    settings: dict[str, Any] = {
        "queue": "default",
        "max_attempts": 5,
        "retry_base": 1.0,
        "retry_cap": 10.0,
        "lease": 300.0,
    }
    settings.update(options)
    return make_task(lambda **_: None, name=name, **settings)
