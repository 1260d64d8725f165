"""A workflow run's history: its recorded entries (``Entry``), read when the run starts, and the
records of steps and sleeps at their places, on the app's sync or async pool (``Store``,
``AsyncStore``) or in the transaction of a step's own writes. Every record is fenced by the run's
lease: a run whose attempt no longer holds its job records nothing (``WorkflowLeaseLost``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import PgjobsError
from pgjobs.models import Job
from pgjobs.pools import Pools
from pgjobs.workflow_entries import WorkflowEntry, WorkflowEntryKind, WorkflowEntryStatus


class WorkflowLeaseLost(PgjobsError):
    """A workflow's run found that its attempt no longer holds the job (its lease expired and
    another attempt was claimed, or it was cancelled): it records nothing more and stops; the
    attempt that holds the job goes on from the history."""


class Entry(NamedTuple):
    """One recorded entry of a workflow's history, as a run reads it."""

    seq: int
    kind: str
    name: str
    status: str
    result: Any
    error: str | None
    error_type: str | None
    attempts: int
    #: A sleep's wake time as seconds from when it was read (the database's clock); else None.
    wake_in: float | None

    @property
    def done(self) -> bool:
        return self.status == WorkflowEntryStatus.DONE


def _entry(row: Sequence[Any]) -> Entry:
    return Entry(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8])


@dataclass(slots=True)
class StepRecord:
    """A step's outcome to record at ``seq``: done with ``result`` (JSON text), or failed or
    waiting for a retry with ``error``."""

    seq: int
    name: str
    status: WorkflowEntryStatus
    attempts: int
    started_at: datetime
    result: str | None = None
    error: str | None = None
    error_type: str | None = None
    transactional: bool = False

    def params(self, job: Job) -> dict[str, Any]:
        return {
            **fence(job),
            "seq": self.seq,
            "name": self.name,
            "status": str(self.status),
            "result": self.result,
            "error": self.error,
            "error_type": self.error_type,
            "attempts": self.attempts,
            "transactional": self.transactional,
            "started_at": self.started_at,
        }


def fence(job: Job) -> dict[str, Any]:
    """The bind parameters of a record's lease fence: the job, the run's attempt and owner."""
    return {"job_id": job.id, "attempt": job.attempts, "owner": job.lease_owner}


def sleep_params(
    job: Job, seq: int, seconds: float | None, until: datetime | None
) -> dict[str, Any]:
    return {
        **fence(job),
        "seq": seq,
        "name": WorkflowEntryKind.SLEEP.value,
        "seconds": seconds,
        "until": until,
    }


def result_text(value: Any) -> str | None:
    """A step's result as the history stores it (None for None); ``TypeError`` or
    ``ValueError`` when JSON has no form for it."""
    if value is None:
        return None
    return json.dumps(value, allow_nan=False)


class Store:
    """The history of one run of a sync workflow, on the app's sync pool."""

    def __init__(self, pools: Pools, job: Job) -> None:
        self.pools = pools
        self.job = job

    def load(self) -> list[Entry]:
        params = {"job_id": self.job.id}
        return [_entry(row) for row in self.pools.run(_rows(queries.WORKFLOW_HISTORY, params))]

    def entry(self, seq: int) -> Entry | None:
        params = {"job_id": self.job.id, "seq": seq}
        rows = self.pools.run(_rows(queries.WORKFLOW_ENTRY, params))
        return _entry(rows[0]) if rows else None

    def record_step(self, record: StepRecord, conn: psycopg.Connection[Any] | None) -> bool:
        """Record ``record``; on ``conn`` (a step's open transaction) when given. False when the
        place was taken by another run or the lease is lost (nothing recorded)."""
        params = record.params(self.job)
        if conn is not None:
            with db.translate_errors(self.pools.dsn):
                return bool(conn.execute(queries.WORKFLOW_STEP_RECORD, params).fetchall())
        return bool(self.pools.run(_rows(queries.WORKFLOW_STEP_RECORD, params)))

    def record_sleep(self, seq: int, seconds: float | None, until: datetime | None) -> float | None:
        """Record a sleep; the seconds until it wakes, None when nothing was recorded."""
        params = sleep_params(self.job, seq, seconds, until)
        rows = self.pools.run(_rows(queries.WORKFLOW_SLEEP_RECORD, params))
        return float(rows[0][0]) if rows else None

    def transaction_connection(self) -> psycopg.Connection[Any]:
        """A connection of the sync pool for a step's transaction (``give_back`` it)."""
        return db.checkout(self.pools.sync(), self.pools.dsn)

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        self.pools.sync().putconn(conn)


class AsyncStore:
    """``Store`` for an async workflow, on the app's async pool of the running loop."""

    def __init__(self, pools: Pools, job: Job) -> None:
        self.pools = pools
        self.job = job

    async def load(self) -> list[Entry]:
        params = {"job_id": self.job.id}
        rows = await self.pools.run_async(_rows_async(queries.WORKFLOW_HISTORY, params))
        return [_entry(row) for row in rows]

    async def entry(self, seq: int) -> Entry | None:
        params = {"job_id": self.job.id, "seq": seq}
        rows = await self.pools.run_async(_rows_async(queries.WORKFLOW_ENTRY, params))
        return _entry(rows[0]) if rows else None

    async def record_step(
        self, record: StepRecord, conn: psycopg.AsyncConnection[Any] | None
    ) -> bool:
        params = record.params(self.job)
        if conn is not None:
            with db.translate_errors(self.pools.dsn):
                cursor = await conn.execute(queries.WORKFLOW_STEP_RECORD, params)
                return bool(await cursor.fetchall())
        return bool(await self.pools.run_async(_rows_async(queries.WORKFLOW_STEP_RECORD, params)))

    async def record_sleep(
        self, seq: int, seconds: float | None, until: datetime | None
    ) -> float | None:
        params = sleep_params(self.job, seq, seconds, until)
        rows = await self.pools.run_async(_rows_async(queries.WORKFLOW_SLEEP_RECORD, params))
        return float(rows[0][0]) if rows else None

    async def transaction_connection(self) -> psycopg.AsyncConnection[Any]:
        pool, dsn = await self.pools.running_loop()
        return await db.checkout_async(pool, dsn)

    async def give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        pool, _dsn = await self.pools.running_loop()
        await pool.putconn(conn)


def _rows(
    statement: str, params: dict[str, Any]
) -> Callable[[psycopg.Connection[Any], Dsn], list[Any]]:
    """What ``Pools.run`` runs: ``statement`` with ``params``, its rows, errors translated."""

    def work(conn: psycopg.Connection[Any], dsn: Dsn) -> list[Any]:
        with db.translate_errors(dsn):
            return conn.execute(statement, params).fetchall()

    return work


def _rows_async(
    statement: str, params: dict[str, Any]
) -> Callable[[psycopg.AsyncConnection[Any], Dsn], Awaitable[list[Any]]]:
    """``_rows`` for ``Pools.run_async``."""

    async def work(conn: psycopg.AsyncConnection[Any], dsn: Dsn) -> list[Any]:
        with db.translate_errors(dsn):
            cursor = await conn.execute(statement, params)
            return await cursor.fetchall()

    return work


def of(target: db.Target, job_id: int) -> list[WorkflowEntry]:
    """Job ``job_id``'s workflow history in order (empty for a job that is no workflow, or has
    recorded nothing yet), wherever the job is.

    Example: ``[e.name for e in history.of(dsn, 42)] == ["charge", "reserve", "sleep"]``
    """
    with db.target_connection(target) as conn:
        rows = conn.execute(queries.WORKFLOW_HISTORY_SHOW, {"job_id": job_id}).fetchall()
    return [
        WorkflowEntry(
            seq,
            WorkflowEntryKind(kind),
            name,
            WorkflowEntryStatus(status),
            attempts,
            result,
            error,
            error_type,
            transactional,
            started_at,
            recorded_at,
            wake_at,
        )
        for (
            seq, kind, name, status, attempts, result, error, error_type, transactional,
            started_at, recorded_at, wake_at,
        ) in rows
    ]  # fmt: skip
