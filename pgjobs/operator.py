"""The operator's half of ``pgjobs.App``: queues and schedules paused, limited and run; jobs
looked up, cancelled, edited, replayed, redriven, their outcomes reported by external workers;
batches and their results. Each call runs one operation of ``admin``, ``queues``,
``schedules``, ``editing``, ``batches`` or ``flow`` on a connection of the app's pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import psycopg

from pgjobs import events, flow, queues
from pgjobs.errors import ConfigurationError
from pgjobs.models import JobHistory
from pgjobs.pools import Pools
from pgjobs.rates import Rate
from pgjobs.submission import DEFAULT_BATCH_SIZE
from pgjobs.tags import check as tags_filter
from pgjobs.tasks import Task

if TYPE_CHECKING:
    from pgjobs import batches, schedules

P = ParamSpec("P")
R = TypeVar("R")


class Operator:
    """What an operator does through an App (``App`` inherits it): every method runs on the
    app's pool (``_pools``) and knows the app's tasks (``_tasks``)."""

    _pools: Pools
    _tasks: dict[str, Task]

    def pause_queue(self, name: str, *, reason: str | None = None) -> queues.Change:
        """Pause queue ``name``: no worker claims its jobs from its next claim on (they stay
        ready); running jobs finish. See ``pgjobs.queues.pause``.

        Example: ``app.pause_queue("emails", reason="SMTP outage")``
        """
        return self._on_pool(queues.pause, name, reason=reason)

    def resume_queue(self, name: str) -> queues.Change:
        """Resume queue ``name``; idle workers serving it claim its jobs at once.

        Example: ``app.resume_queue("emails")``
        """
        return self._on_pool(queues.resume, name)

    def pause_schedule(self, name: str, *, reason: str | None = None) -> schedules.ScheduleChange:
        """Pause periodic schedule ``name``: none of its occurrences is enqueued until it is
        resumed. See ``pgjobs.schedules.pause``.

        Example: ``app.pause_schedule("reports.hourly", reason="warehouse migration")``
        """
        from pgjobs import schedules

        return self._on_pool(schedules.pause, name, reason=reason)

    def resume_schedule(self, name: str) -> schedules.ScheduleChange:
        """Resume periodic schedule ``name``; the occurrences it missed while paused run as its
        ``catch_up`` rule says. See ``pgjobs.schedules.resume``.

        Example: ``app.resume_schedule("reports.hourly")``
        """
        from pgjobs import schedules

        return self._on_pool(schedules.resume, name)

    def limit_queue(
        self,
        name: str,
        *,
        concurrency: int | None = queues.KEEP,
        rate: str | Rate | None = queues.KEEP,
        group_concurrency: int | None = queues.KEEP,
        group_rate: str | Rate | None = queues.KEEP,
    ) -> queues.Change:
        """Set queue ``name``'s concurrency limit, rate, group concurrency and group rate (None
        removes one; one not given stays), obeyed by every worker from its next claim on. See
        ``pgjobs.queues.limit``.

        Example: ``app.limit_queue("emails", concurrency=10, rate="100/s")``
        """
        return self._on_pool(
            queues.limit,
            name,
            concurrency=concurrency,
            rate=rate,
            group_concurrency=group_concurrency,
            group_rate=group_rate,
        )

    def batch_status(self, batch_id: int) -> batches.BatchStatus:
        """Batch ``batch_id``: its counts, its callback, its members by status (``BatchNotFound``
        for an unknown id).

        Example: ``app.batch_status(7).pending``
        """
        from pgjobs import batches

        return self._on_pool(batches.status, batch_id)

    def batch_results(self, batch_id: int, *, page_size: int = 500) -> Iterator[flow.JobResult]:
        """Every member of batch ``batch_id`` in id order with its outcome and result, read
        ``page_size`` at a time (one page in memory; see ``pgjobs.flow``).

        Example: ``rows = sum(m.result for m in app.batch_results(7) if m.succeeded)``
        """
        return flow.iter_batch(self._pools, batch_id, page_size)

    def batch_results_async(
        self, batch_id: int, *, page_size: int = 500
    ) -> AsyncIterator[flow.JobResult]:
        """``batch_results`` for asyncio: ``async for member in app.batch_results_async(7)``."""
        return flow.iter_batch_async(self._pools, batch_id, page_size)

    def batch_results_page(
        self, batch_id: int, *, after: int = 0, limit: int = 500
    ) -> flow.ResultsPage:
        """One page of ``batch_results``: the members after member ``after`` (0: the first),
        at most ``limit``, and the ``next_after`` of the next page (None: the last).

        Example: ``page = app.batch_results_page(7, after=page.next_after)``
        """
        return self._on_pool(flow.batch_page, batch_id, after, limit)

    def send_event(
        self, job: int | str, name: str, payload: Any = None, *, connection: Any = None
    ) -> events.SentEvent:
        """Send event ``name`` to workflow job ``job`` (its id or idempotency key), for its
        ``ctx.wait_for(name)``: kept until taken, and a workflow waiting for it is ready at once.
        With ``connection`` (psycopg or SQLAlchemy) it is part of the caller's transaction.

        Example: ``app.send_event(order_job, "payment_confirmed", {"amount": 1200})``
        """
        if connection is None:
            return self._on_pool(events.send, job, name, payload)
        return events.send(events.psycopg_connection(connection), job, name, payload)

    async def send_event_async(
        self, job: int | str, name: str, payload: Any = None, *, connection: Any = None
    ) -> events.SentEvent:
        """``send_event`` for asyncio code (``connection``: a psycopg ``AsyncConnection``)."""
        if connection is None:
            return await asyncio.to_thread(self._on_pool, events.send, job, name, payload)
        return await events.send_async(connection, job, name, payload)

    def job(self, job_id: int) -> JobHistory:
        """A job wherever it is (queued, archived or dead), with its whole record.

        Example: ``app.job(42).status``; raises ``JobNotFound`` for an unknown id.
        """
        from pgjobs import admin

        return self._on_pool(admin.job, job_id)

    def cancel(self, job_id: int, *, force: bool = False) -> JobHistory:
        """Archive a queued job as cancelled, unrun. A running job is refused
        (``JobStateConflict``) unless ``force``: it is then cancelled at once, its handler asked
        to stop (an async one is cancelled, a sync one sees ``current_job().cancelled``) and
        its outcome discarded (see ``pgjobs.admin.cancel``).

        Example: ``app.cancel(42)``
        """
        from pgjobs import admin

        return self._on_pool(admin.cancel, job_id, force=force)

    def edit(
        self,
        job_id: int,
        *,
        priority: int | None = None,
        run_at: datetime | None = None,
        run_in: float | timedelta | None = None,
        payload: dict[str, Any] | None = None,
        max_attempts: int | None = None,
        tags: Sequence[str] | None = None,
        by: str | None = None,
    ) -> JobHistory:
        """Change the given fields of a queued job that is not running, its payload checked
        against this app's handler, and record the edit as ``by`` (see ``pgjobs.editing``); a
        running, finished or dead job is refused (``JobStateConflict``). Returns the job.

        Example: ``app.edit(42, priority=7, by="alice")``
        """
        from pgjobs import editing

        done = self._on_pool(
            editing.edit,
            job_id,
            priority=priority,
            run_at=run_at,
            run_in=run_in,
            payload=payload,
            max_attempts=max_attempts,
            tags=tags,
            by=by,
            tasks=self._tasks,
        )
        return done.job

    def replay(
        self,
        job_id: int,
        *,
        expires_at: datetime | None = None,
        expires_in: float | timedelta | None = None,
    ) -> int:
        """Enqueue a finished or dead job again as a new job linked to it; returns the new id.
        The copy of an expired job is archived at once as expired unless a new expiry is given
        (see ``pgjobs.admin.replay``).

        Example: ``new_id = app.replay(42, expires_in=600)``
        """
        from pgjobs import admin

        return self._on_pool(admin.replay, job_id, expires_at=expires_at, expires_in=expires_in)

    def report_outcome(
        self,
        job_id: int,
        *,
        attempt: int,
        status: str,
        retryable: bool = True,
        error: str | None = None,
        result: Any = None,
    ) -> JobHistory:
        """Record the outcome an external worker reports for attempt ``attempt`` of a running
        job (``"succeeded"`` or ``"failed"``); the job's own task's retry policy applies when
        this app registers it. ``StaleOutcome`` when that attempt no longer holds the job (see
        ``pgjobs.admin.report_outcome``).

        Example: ``app.report_outcome(42, attempt=1, status="failed", error="card declined")``
        """

        from pgjobs import admin

        def report(conn: psycopg.Connection[Any]) -> JobHistory:
            task = self._tasks.get(admin.job(conn, job_id).task)
            return admin.report_outcome(
                conn,
                job_id,
                attempt=attempt,
                status=status,
                retryable=retryable,
                error=error,
                result=result,
                retry=task.retry if task is not None else None,
                external=task.external is not None if task is not None else None,
            )

        return self._on_pool(report)

    def redrive(
        self,
        *ids: int,
        queue: str | None = None,
        task: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        error: str | None = None,
        fingerprint: str | None = None,
        tags: Sequence[str] | None = None,
        everything: bool = False,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> int:
        """Move dead jobs back to the queue with fresh attempts; returns how many moved.

        Pass ids, or filters (as ``pgjobs dead redrive``), or ``everything=True`` for every dead
        job. Named ids must all be dead, else ``JobNotFound`` and nothing moves. ``tags``: the
        jobs carrying every one of them.

        Example: ``app.redrive(task="images.resize", error="timeout")``
        """
        from pgjobs import admin

        where = admin.DeadFilter(
            ids=ids or None,
            queue=queue,
            task=task,
            since=since,
            until=until,
            error=error,
            fingerprint=fingerprint,
            tags=tags_filter(tags),
        )
        if where.matches_all and not everything:
            raise ConfigurationError(
                "redrive needs job ids or a filter; pass everything=True to redrive every dead job"
            )
        return self._on_pool(admin.redrive, where, batch_size=batch_size)

    def _on_pool(
        self,
        operation: Callable[Concatenate[psycopg.Connection[Any], P], R],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``operation(conn, *args, **kwargs)`` on a connection of the app's pool, errors
        translated: how the admin and queue operations below run."""
        with self._pools.connection() as conn:
            return operation(conn, *args, **kwargs)
