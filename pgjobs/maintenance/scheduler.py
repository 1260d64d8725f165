"""The scheduler: enqueues each due occurrence of the app's periodic schedules, once.

Every worker that runs maintenance and whose app declares schedules (``@app.periodic``) runs
it. A round:

1. records the schedules this worker declares (``SCHEDULE_DECLARE``: new ones start at their
   first occurrence after now), at the first round and then every ``DECLARE_EVERY`` seconds, so
   that `pgjobs schedule` can tell schedules no running worker declares any more;
2. asks whether any of its schedules is due (``SCHEDULE_ANY_DUE``, one statement: most rounds
   end there); when one is,
3. in one transaction, locks the due schedules no other worker holds (``FOR UPDATE SKIP
   LOCKED``), enqueues their due occurrences (``Periodic.due``: the catch-up rule, DST) with
   ``run_at`` the scheduled instant and the idempotency key ``periodic:<name>:<instant>``, and
   moves ``next_run_at`` past now.

The row lock makes each occurrence enqueued once however many workers run; the idempotency key
keeps it once even if a schedule's row is deleted and recreated. Instants are computed from the
database's clock, so workers whose clocks disagree still agree on what is due.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg

from pgjobs import db, queries
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import RoundResult, Service, ServiceConfig, log
from pgjobs.periodic import Periodic
from pgjobs.submission import DEFAULT_QUEUE, JobSpec

#: Seconds between rounds: how late an occurrence may be enqueued (cron works to the second).
SCHEDULER_INTERVAL = 1.0
#: Seconds between two records of the declared schedules (each a small write per schedule).
DECLARE_EVERY = 10.0


class EnqueueMany(Protocol):
    """How the scheduler enqueues: ``App.enqueue_many_async`` (validation, the task's
    defaults), on the scheduler's connection, inside its transaction."""

    def __call__(
        self, jobs: Iterable[JobSpec], *, connection: Any = None
    ) -> Awaitable[list[int]]: ...


@dataclass(frozen=True, slots=True)
class Scheduled(RoundResult):
    """Jobs enqueued this round, and missed occurrences skipped by the catch-up rules."""

    enqueued: int
    skipped: int


class Scheduler(Service[Scheduled]):
    """Enqueues the due occurrences of ``schedules`` (see the module's docstring).

    Example: ``await Scheduler(app.periodics.values(), app.enqueue_many_async).run_once(conn)``
    """

    name = "scheduler"
    default_interval = SCHEDULER_INTERVAL
    # An occurrence enqueued is the schedule doing its work (logged at DEBUG); a schedule added,
    # an occurrence skipped or a round that fails are logged at INFO or above.
    round_log_level = logging.DEBUG

    def __init__(
        self,
        schedules: Iterable[Periodic],
        enqueue_many: EnqueueMany,
        config: ServiceConfig | None = None,
    ) -> None:
        super().__init__(config)
        schedules = list(schedules)
        names = [s.name for s in schedules]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"schedule names must be unique, got {sorted(names)}")
        self.schedules = {s.name: s for s in schedules}
        self._enqueue_many = enqueue_many
        self._declared_at: float | None = None  # time.monotonic() of the last record

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Scheduled:
        if not self.schedules:
            return Scheduled(0, 0)
        if self._declared_at is None or time.monotonic() - self._declared_at >= DECLARE_EVERY:
            await self.declare(conn)
        names = {"names": list(self.schedules)}
        if not (await db.fetch_all_async(conn, queries.SCHEDULE_ANY_DUE, names))[0][0]:
            return Scheduled(0, 0)  # most rounds: one statement, no transaction
        async with conn.transaction():
            due = await db.fetch_all_async(conn, queries.SCHEDULE_LOCK_DUE, names)
            if not due:
                return Scheduled(0, 0)
            return await self._enqueue_due(conn, due)

    async def declare(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Record this worker's schedules in ``pgjobs_schedules``; a schedule new there is
        logged (at INFO) with its first occurrence."""
        now = await _now(conn)
        ordered = sorted(self.schedules.values(), key=lambda s: s.name)
        firsts = [s.after(now) for s in ordered]
        declared = await db.fetch_all_async(
            conn,
            queries.SCHEDULE_DECLARE,
            {
                "names": [s.name for s in ordered],
                "tasks": [s.task for s in ordered],
                "queues": [s.queue or DEFAULT_QUEUE for s in ordered],
                "schedules": [s.schedule for s in ordered],
                "timezones": [s.timezone for s in ordered],
                "catch_ups": [s.catch_up_text for s in ordered],
                "next_run_ats": firsts,
            },
        )
        self._declared_at = time.monotonic()
        first_of = dict(zip([s.name for s in ordered], firsts, strict=True))
        for name, added in declared:
            if added:
                schedule = self.schedules[name]
                log.info(
                    "scheduler: schedule %s added (%s, %s): enqueues %s, first at %s UTC",
                    name,
                    schedule.schedule,
                    schedule.timezone,
                    schedule.task,
                    f"{first_of[name].astimezone(UTC):%Y-%m-%d %H:%M:%S}",
                )

    async def _enqueue_due(
        self, conn: psycopg.AsyncConnection[Any], due: list[tuple[Any, ...]]
    ) -> Scheduled:
        jobs: list[tuple[Periodic, datetime]] = []
        advance: dict[str, list[Any]] = {
            "names": [],
            "next_run_ats": [],
            "last_run_ats": [],
            "last_job_ids": [],
        }
        skipped = 0
        for name, next_run_at, now in due:
            schedule = self.schedules[name]
            found = schedule.due(next_run_at, now)
            if found.skipped:
                log.warning(
                    "scheduler: %s skipped %s%d missed occurrence(s) (catch_up=%s)",
                    name,
                    "at least " if found.skipped >= 1000 else "",
                    found.skipped,
                    schedule.catch_up_text,
                )
            skipped += found.skipped
            jobs += [(schedule, instant) for instant in found.run]
            advance["names"].append(name)
            advance["next_run_ats"].append(found.next_run_at)
            advance["last_run_ats"].append(found.run[-1] if found.run else None)
        ids = await self._insert(conn, jobs)
        last_ids = {schedule.name: job_id for (schedule, _), job_id in zip(jobs, ids, strict=True)}
        advance["last_job_ids"] = [last_ids.get(name) for name in advance["names"]]
        await db.fetch_all_async(conn, queries.SCHEDULE_ADVANCE, advance)
        return Scheduled(len(jobs), skipped)

    async def _insert(
        self, conn: psycopg.AsyncConnection[Any], jobs: list[tuple[Periodic, datetime]]
    ) -> list[int]:
        """Enqueue one job per (schedule, instant), in the round's transaction. A job whose key
        is taken (the occurrence was enqueued before) is not enqueued again; its holder's id is
        returned."""
        if not jobs:
            return []
        return await self._enqueue_many(
            [
                JobSpec(
                    s.task,
                    s.payload,
                    queue=s.queue,
                    priority=s.priority,
                    run_at=instant,
                    max_attempts=s.max_attempts,
                    idempotency_key=s.idempotency_key(instant),
                )
                for s, instant in jobs
            ],
            connection=conn,
        )


async def _now(conn: psycopg.AsyncConnection[Any]) -> datetime:
    rows = await db.fetch_all_async(conn, queries.SCHEDULE_NOW)
    now: datetime = rows[0][0]
    return now
