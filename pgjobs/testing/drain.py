"""``drain``: run every ready job of an app inline, one at a time, as a worker's slot runs it
(``pgjobs.runs``: the same start, timeout and outcome path), and report what happened."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg

from pgjobs import db, flow, queries
from pgjobs.app import App
from pgjobs.completer import ClaimParams, Completer
from pgjobs.completer.params import SettleParams
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.models import DeadReason, Job
from pgjobs.runs import Runs
from pgjobs.tasks import Task

#: Jobs one ``drain`` runs at most (attempts, not distinct jobs): a bound on handlers that
#: enqueue more work forever.
DRAIN_MAX_JOBS = 1000


@dataclass(frozen=True, slots=True)
class Retried:
    """A failed attempt rescheduled ``delay`` seconds later."""

    id: int
    task: str
    attempt: int
    error: str
    delay: float


@dataclass(frozen=True, slots=True)
class Dead:
    """A job moved to dead_letter, and why."""

    id: int
    task: str
    attempt: int
    reason: DeadReason
    error: str


@dataclass(slots=True)
class DrainResult:
    """What ``drain`` did: ids of the attempts that succeeded (a job retried then succeeded
    appears in ``retried`` and ``succeeded``), the failed attempts rescheduled, the jobs
    dead-lettered, and whether it stopped at ``max_jobs`` with work left."""

    succeeded: list[int] = field(default_factory=list)
    retried: list[Retried] = field(default_factory=list)
    dead: list[Dead] = field(default_factory=list)
    #: Handler runs (attempts), including jobs dead-lettered without running (unknown task,
    #: payload that does not fit).
    runs: int = 0
    #: ``max_jobs`` runs were reached while a job was still ready (it was left queued).
    stopped_at_max_jobs: bool = False
    #: Results returned by the handlers, by job id (the last attempt's).
    results: dict[int, Any] = field(default_factory=dict)
    #: Jobs of external tasks, left queued as they were: a worker delivers them over HTTP.
    skipped: list[int] = field(default_factory=list)

    def _record(self, batch: SettleParams, tasks: Mapping[int, Job]) -> None:
        self.succeeded += batch.ok_ids
        for job_id, attempt, error, delay in zip(
            batch.retry_ids,
            batch.retry_attempts,
            batch.retry_errors,
            batch.retry_delays,
            strict=True,
        ):
            self.retried.append(Retried(job_id, tasks[job_id].task, attempt, error, delay))
        for job_id, attempt, reason, error in zip(
            batch.dead_ids, batch.dead_attempts, batch.dead_reasons, batch.dead_errors, strict=True
        ):
            self.dead.append(Dead(job_id, tasks[job_id].task, attempt, DeadReason(reason), error))


def drain(
    app: App,
    *,
    include_scheduled: bool = False,
    max_jobs: int = DRAIN_MAX_JOBS,
    now: datetime | None = None,
    queues: Sequence[str] | None = None,
) -> DrainResult:
    """Run every ready job of ``app``'s queues inline, one at a time, until none is left, and
    return what happened. Outcomes take the worker's path (``pgjobs.completer``): a failure is
    retried with the task's backoff, the last attempt or a ``NonRetryableError`` goes to
    dead_letter, an unknown task or a payload that does not fit the handler too; sync and async
    handlers alike, with ``pgjobs.current_job()`` set, stopped at their task's ``timeout`` and
    their progress written, as in a worker (each job starts as a worker's slot starts it).

    Scheduled jobs (run_at in the future, and retries waiting for their backoff) are not run
    unless ``include_scheduled``: then the clock advances to the next job due, again and again,
    until nothing is left (a job that keeps failing ends in dead_letter). ``now`` runs the jobs
    due by that moment only (retries included). Advancing the clock moves a job's run_at (and
    expires_at, by as much) back to the database's now(); the row is otherwise untouched.

    ``max_jobs`` bounds the handler runs (``stopped_at_max_jobs`` says it was reached);
    ``queues`` defaults to those of the app's tasks. Jobs of external tasks are not delivered:
    they stay queued as they were (``skipped``). Tasks' concurrency limits and rates do not
    hold jobs back (one runs at a time); a queue's limits, set in the database, do.

    Example::

        result = drain(app, include_scheduled=True)
        assert [d.reason for d in result.dead] == ["exhausted"]
    """
    if max_jobs < 1:
        raise ConfigurationError(f"max_jobs must be >= 1, got {max_jobs}", field="max_jobs")
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ConfigurationError("now must be timezone-aware", field="now")
    tasks = dict(app.tasks)
    chosen = list(queues) if queues is not None else sorted({t.queue for t in tasks.values()})
    if not chosen:
        raise ConfigurationError("the app registers no tasks, so drain has no queue to run")
    run = _Drain(app.dsn, tasks, chosen, include_scheduled, max_jobs, now)
    result: DrainResult = run_coroutine(run.run)
    return result


def run_coroutine(make: Callable[[], Any]) -> Any:
    """``asyncio.run(make())``, in a thread of its own when this one already runs an event loop
    (an async test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result()


class _Drain:
    def __init__(
        self,
        dsn: Dsn,
        tasks: dict[str, Task],
        queues: list[str],
        include_scheduled: bool,
        max_jobs: int,
        now: datetime | None,
    ) -> None:
        self.dsn = dsn
        #: Where handlers read other jobs' results (current_job().dependency_results()).
        self.reads = flow.Direct(dsn)
        self.tasks = tasks
        self.queues = queues
        self.include_scheduled = include_scheduled
        self.max_jobs = max_jobs
        self.now = now
        owner = f"pgjobs.testing:{os.getpid()}:{secrets.token_hex(4)}"
        # One job at a time, and no task's rate holds a test back: tasks' limits are not
        # claimed under (a queue's limit, set in the database, is).
        claim = ClaimParams.for_tasks(owner, queues, tasks.values())
        self.completer = Completer(
            replace(
                claim,
                limit_tasks=[],
                limit_concurrency=[],
                limit_rate_jobs=[],
                limit_rate_seconds=[],
            )
        )
        self.result = DrainResult()
        self.jobs: dict[int, Job] = {}
        #: Jobs of external tasks claimed so far: held (so that the next claim passes them by)
        #: until the end, then given back with their attempt refunded.
        self.held: list[Job] = []

    async def run(self) -> DrainResult:
        # One slot, whose handlers' results drain reports.
        runs = Runs(self.tasks, 1, self.completer, asyncio.Event(), results=self.result.results)
        runs.reads = self.reads
        runs.open(asyncio.get_running_loop())
        conn = await db.connect_async(self.dsn)
        try:
            claimed = await self._trip(conn, 1)
            while True:
                if not claimed:
                    if not await self._advance(conn):
                        break
                    claimed = await self._trip(conn, 1)
                    continue
                for job in claimed:
                    await self._run(runs, job)
                if self.result.runs >= self.max_jobs:
                    self.result.stopped_at_max_jobs = await self._ready_left(conn)
                    break
                claimed = await self._trip(conn, 1)
            for job in self.held:
                self.completer.outcomes.release(job, refund=True)
            if len(self.completer.outcomes):
                await self._trip(conn, 0)
        finally:
            await conn.close()
            # A sync handler given up at its timeout may run on: as a worker, not waited for.
            runs.close(wait=not runs.stray_threads())
        return self.result

    async def _trip(self, conn: psycopg.AsyncConnection[Any], limit: int) -> list[Job]:
        """Send the outcomes buffered (recording them first) and claim up to ``limit`` jobs."""
        outcomes = self.completer.outcomes
        while True:
            settled = len(outcomes) > 0
            if settled:
                batch = outcomes.drain()
                self.result._record(batch, self.jobs)
                outcomes.restore(batch)
            plain = not self.completer.limited
            done = await self.completer.trip(conn, limit)
            for job in (*done.jobs, *done.unloadable):  # the latter buried at once, to record
                self.jobs[job.id] = job
            # Jobs whose rows could not be loaded are not runs: send their burial, claim again.
            # A success may have released jobs waiting for it, which the claim in the same
            # statement could not see yet: claim once more. A plain claim leaves jobs with a
            # group (and of limited queues), and says so: the next claim, under limits,
            # takes them.
            learned = plain and self.completer.limited and limit > 0
            if done.jobs or not (done.unloadable or (settled and limit) or learned):
                return done.jobs

    async def _advance(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Move the clock to the next scheduled job (or to ``now``); whether any job became
        ready."""
        if not self.include_scheduled and self.now is None:
            return False
        rows = await db.fetch_all_async(
            conn, queries.TESTING_ADVANCE_CLOCK, {"queues": self.queues, "until": self.now}
        )
        return bool(rows)

    async def _ready_left(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether a job drain would run is still ready (``max_jobs`` was reached): claims one
        and gives it back untouched (its attempt refunded)."""
        while claimed := await self._trip(conn, 1):
            (job,) = claimed
            task = self.tasks.get(job.task)
            if task is not None and task.external is not None:
                self.held.append(job)
                self.result.skipped.append(job.id)
                continue
            self.completer.outcomes.release(job, refund=True)
            return True
        return False

    async def _run(self, runs: Runs, job: Job) -> None:
        """Run ``job`` as a worker's slot runs it (``pgjobs.runs.Runs``: its arguments, its
        ``current_job()``, its span, its timeout, its outcome) and wait for it to leave its
        slot."""
        task = self.tasks.get(job.task)
        if task is not None and (
            task.external is not None or (job.payload_version or 1) > task.version
        ):
            # Not for this process: a worker delivers an external task's job over HTTP, and a
            # payload newer than the app's task waits for newer code. Left queued as it was.
            self.held.append(job)
            self.result.skipped.append(job.id)
            return
        self.result.runs += 1
        runs.start(job)
        while runs.busy:
            await runs.changed.wait()
            runs.changed.clear()
