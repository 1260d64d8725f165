"""The ``Completer``: one worker's outcome path. It classifies how each attempt ended (deciding
its ``Outcome``), buffers it in ``Outcomes``, holds the lease extensions handlers asked for, and
sends both with the next claim in one round trip (``trip.settle_and_claim``). What the database
applied comes back and is interpreted here: an outcome that was not applied lost its lease (its
job was rescued or claimed elsewhere), an extension that was refused marks its
``JobContext.lease_lost``. Each outcome carries the attempt it settles: with the lease owner,
that is the fence that keeps a stale worker from touching a job re-claimed elsewhere.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, NamedTuple

import psycopg

from pgjobs.completer.outcomes import TIMEOUT_ERROR_TYPE, Outcome, Outcomes, timeout_error
from pgjobs.completer.params import ClaimParams, ClaimStatus, ExtendParams, ProgressParams
from pgjobs.completer.trip import report_stale, settle_and_claim, settle_apart, unloadable_jobs
from pgjobs.context import JobContext
from pgjobs.errors import (
    DatabaseUnavailable,
    NonRetryableError,
    PoolerMismatch,
    QueryFailed,
    SchemaMissing,
    Snooze,
    StepFailed,
    WorkflowDiverged,
    WorkflowSuspended,
    snoozed_for,
)
from pgjobs.models import DeadReason, Job
from pgjobs.tasks import Task
from pgjobs.text import MAX_RESULT_BYTES, error_text, error_type, result_json, traceback_text

# Outcomes are what a worker did with its jobs: they log under the worker's name.
log = logging.getLogger("pgjobs.worker")

#: Seconds between two claims under the tasks' limits while nothing else calls for one (a job
#: of a limited task ending here, jobs enqueued, a claim that held jobs back, a rate's next
#: token): the other claims pass the limited tasks' jobs by, so this bounds how long a slot
#: freed by another worker, or a limited job enqueued while the worker is busy, waits.
LIMITS_RECHECK = 1.0

# The outcomes as module globals: an enum member read through its class costs ~0.1 µs, once per
# job on the worker's busiest path.
_SUCCEEDED, _RETRIED, _DEAD, _RELEASED, _SNOOZED = (
    Outcome.SUCCEEDED,
    Outcome.RETRIED,
    Outcome.DEAD,
    Outcome.RELEASED,
    Outcome.SNOOZED,
)


class Claimed(NamedTuple):
    """What ``Completer.trip`` claimed: the jobs, the claim's status when it gave one, how many
    jobs it asked for; the jobs claimed that were sent to dead_letter at once, their rows
    holding a value Python cannot hold (not in ``jobs``); and what the database refused when it
    refused the trip (the claim or the lease extensions, and why)."""

    jobs: list[Job]
    status: ClaimStatus | None
    asked: int
    unloadable: tuple[Job, ...] = ()
    refused: str | None = None


class Completer:
    """One worker's outcome path: it classifies and buffers outcomes, holds lease extensions
    until the next trip, sends both with the next claim, and interprets what was applied.

    Every method runs on the worker's event loop.
    """

    def __init__(
        self,
        claim: ClaimParams,
        *,
        recheck: float = LIMITS_RECHECK,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        self.owner = claim.owner
        self._max_result_bytes = max_result_bytes
        self.claim = claim
        self.outcomes = Outcomes(claim.owner)
        self._extensions: dict[int, tuple[JobContext, float]] = {}
        #: Jobs whose handler's latest progress is to be written on the next trip.
        self._progress: dict[int, JobContext] = {}
        # Some of the worker's queues are limited (the last claim said so): every claim is one
        # under limits (all of those queues' jobs are).
        self._queue_limits = False
        # When the next claim under the tasks' limits is due (time.monotonic()); meanwhile the
        # claims pass the limited tasks' jobs by, as cheap as those of a worker without limits.
        self._recheck = recheck
        self._limits_due = 0.0 if claim.limit_tasks else math.inf

    @property
    def limited(self) -> bool:
        """Some of the worker's tasks, or of its queues, have a concurrency limit or a rate."""
        return bool(self.claim.limit_tasks) or self._queue_limits

    def limits_due(self) -> None:
        """Claim under the tasks' limits on the next trip: a job of a limited task ended here
        (its slot under the limit is free), or jobs were enqueued (some may be limited ones)."""
        if self.claim.limit_tasks:
            self._limits_due = 0.0

    def _claim_under_limits(self, limit: int) -> bool:
        return limit > 0 and (self._queue_limits or time.monotonic() >= self._limits_due)

    def _learn(self, status: ClaimStatus | None, under_limits: bool, *, short: bool) -> None:
        """What a claim said of the limits: which claim comes next, and when. A plain claim
        that came back short may have met jobs of limited tasks, which it leaves where they are:
        the next claim is one under limits (it takes them or holds them back)."""
        self._queue_limits = status is not None and status.queue_limits
        if not self.claim.limit_tasks:
            return
        if not under_limits:
            if short:
                self._limits_due = 0.0
            return
        now = time.monotonic()
        due = now + self._recheck  # other workers free slots and refill buckets meanwhile
        if status is not None:
            if status.held:
                due = now  # more jobs of limited tasks may lie in the queues' ranges
            soon = status.retry_after()
            if soon is not None:
                due = min(due, now + soon)
        self._limits_due = due

    @property
    def pending(self) -> bool:
        """Something waits to be sent: an outcome, a lease extension or a progress."""
        return bool(len(self.outcomes) or self._extensions or self._progress)

    @property
    def extensions_pending(self) -> bool:
        """A lease extension waits: the next trip should not wait to gather a batch."""
        return bool(self._extensions)

    def finished(self, job: Job, task: Task, result: Any, exc: BaseException | None) -> Outcome:
        """Record how ``job``'s handler ended: it returned ``result`` or raised ``exc``. Returns
        the outcome decided: ``SUCCEEDED``, ``RETRIED`` or ``DEAD``."""
        self._extensions.pop(job.id, None)
        if exc is None:
            self.outcomes.succeed(job, result_json(result, self._max_result_bytes))
            return _SUCCEEDED
        if isinstance(exc, WorkflowSuspended | StepFailed | WorkflowDiverged):
            return self._workflow_ended(job, exc)
        if isinstance(exc, Snooze):
            try:
                seconds = snoozed_for(exc)
            except ValueError as problem:  # not a snooze's seconds: the attempt fails, saying so
                exc = problem
            else:
                return self._snoozed(job, task, seconds)
        error = error_text(exc)
        where = f"job {job.id} ({job.task}) failed on attempt {job.attempts}/{job.max_attempts}"
        worth_retry = not isinstance(exc, NonRetryableError) and task.retry.retries(exc)
        if not worth_retry or job.is_last_attempt:
            reason = DeadReason.EXHAUSTED if worth_retry else DeadReason.NON_RETRYABLE
            trace = traceback_text(exc)
            self.outcomes.bury(job, reason, error, error_type(exc), trace)
            log.warning("%s: %s; sent to dead_letter (%s)", where, error, reason)
            return _DEAD
        delay = task.retry.delay(job.attempts, exc)
        self.outcomes.retry(job, delay, error)
        log.warning("%s: %s; retry in %.1fs", where, error, delay)
        return _RETRIED

    def _workflow_ended(
        self, job: Job, exc: WorkflowSuspended | StepFailed | WorkflowDiverged
    ) -> Outcome:
        """A durable workflow's run ended by suspending (a sleep, a step's long retry wait:
        back to the queue, its attempt refunded, not counted as a snooze), by a step that
        failed for good (dead_letter with the step's error), or by diverging from its
        recorded history (``workflow_diverged``)."""
        if isinstance(exc, WorkflowSuspended):
            if exc.settled:  # given back by the run itself, under the job's row lock
                log.debug("job %d (%s) waits (suspended by its run)", job.id, job.task)
                return _SNOOZED
            self.outcomes.release(job, refund=True, hold=exc.seconds)
            log.debug("job %d (%s) suspended for %gs", job.id, job.task, exc.seconds)
            return _SNOOZED
        if isinstance(exc, StepFailed):
            reason = DeadReason.EXHAUSTED if exc.exhausted else DeadReason.NON_RETRYABLE
            cause = exc.__cause__
            trace = traceback_text(cause if cause is not None else exc)
            self.outcomes.bury(job, reason, error_text(exc), exc.error_type, trace)
        else:
            reason = DeadReason.WORKFLOW_DIVERGED
            self.outcomes.bury(job, reason, error_text(exc), error_type(exc), traceback_text(exc))
        log.warning("job %d (%s): %s; sent to dead_letter (%s)", job.id, job.task, exc, reason)
        return _DEAD

    def _snoozed(self, job: Job, task: Task, seconds: float) -> Outcome:
        """``job``'s handler snoozed it: back to the queue for ``seconds``, its attempt
        refunded; past its task's ``max_snoozes``, to dead_letter (``snoozed_out``)."""
        if job.snoozes >= task.max_snoozes:
            error = (
                f"snoozed out: the job asked to snooze again after {job.snoozes} snooze"
                f"{'' if job.snoozes == 1 else 's'}; its task's max_snoozes is {task.max_snoozes}"
            )
            self.outcomes.bury(job, DeadReason.SNOOZED_OUT, error, "pgjobs.errors.Snooze")
            log.warning("job %d (%s): %s; sent to dead_letter", job.id, job.task, error)
            return _DEAD
        self.outcomes.release(job, refund=True, hold=seconds, snooze=True)
        log.debug("job %d (%s) snoozed for %gs", job.id, job.task, seconds)
        return _SNOOZED

    def timed_out(self, job: Job, task: Task, timeout: float) -> Outcome:
        """``job``'s handler ran longer than ``timeout`` seconds: the attempt failed with reason
        timeout. Retried with the task's backoff while attempts remain; on the last attempt (or
        for an at-most-once task, whose handler may still be running) sent to dead_letter with
        reason ``timeout``. Returns the outcome decided: ``RETRIED`` or ``DEAD``."""
        self._extensions.pop(job.id, None)
        error = timeout_error(timeout)
        where = f"job {job.id} ({job.task}) timed out on attempt {job.attempts}/{job.max_attempts}"
        if job.is_last_attempt or task.at_most_once:
            self.outcomes.bury(job, DeadReason.TIMEOUT, error, TIMEOUT_ERROR_TYPE)
            log.warning("%s: %s; sent to dead_letter (%s)", where, error, DeadReason.TIMEOUT)
            return _DEAD
        delay = task.retry.delay(job.attempts)
        self.outcomes.retry(job, delay, error)
        log.warning("%s: %s; retry in %.1fs", where, error, delay)
        return _RETRIED

    def cancelled(self, job: Job) -> Outcome:
        """``job``'s handler was cancelled before it finished: back to the queue, attempt used
        (``RELEASED``)."""
        self._extensions.pop(job.id, None)
        self.outcomes.release(job, refund=False)
        return _RELEASED

    def forget(self, job: Job) -> None:
        """``job`` was cancelled while it ran (``pgjobs cancel --force`` archived it): send
        nothing more for it, not even a lease extension."""
        self._extensions.pop(job.id, None)
        self._progress.pop(job.id, None)

    def end_hold(self, context: JobContext) -> None:
        """The handler of ``context``'s job, cancelled while it ran (``forget``), has ended:
        end on the next trip the lease of the place the cancel kept for it in its group, so that
        the group's next job may start (``queries.JOB_EXTEND_LEASES`` with 0 seconds)."""
        self._extensions[context.job.id] = (context, 0.0)

    def unknown_task(self, job: Job) -> Outcome:
        """No task of ``job``'s name is registered here: to dead_letter (``DEAD``)."""
        self.outcomes.bury(
            job,
            DeadReason.UNKNOWN_TASK,
            f"no task named {job.task!r} is registered with this worker's app",
        )
        log.warning("job %d: unknown task %r, sent to dead_letter", job.id, job.task)
        return _DEAD

    def invalid_payload(self, job: Job, problem: str) -> Outcome:
        """``job``'s payload does not fit its handler, or its row holds a value Python cannot
        load (``problem`` says how): to dead_letter (``DEAD``)."""
        self.outcomes.bury(job, DeadReason.INVALID_PAYLOAD, problem)
        log.warning("job %d (%s): %s, sent to dead_letter", job.id, job.task, problem)
        return _DEAD

    def interrupted(self, job: Job, *, at_most_once: bool) -> Outcome:
        """The shutdown grace period ran out while ``job`` ran: give it back now (its attempt
        stays used) rather than leave it to its lease; an at-most-once job goes to dead_letter,
        never to run again. Returns ``RELEASED`` or ``DEAD``."""
        self._extensions.pop(job.id, None)
        if at_most_once:
            self.outcomes.bury(
                job,
                DeadReason.INTERRUPTED,
                "worker shut down while the at-most-once job was running",
            )
            return _DEAD
        self.outcomes.release(job, refund=False)
        return _RELEASED

    def extend(self, context: JobContext, seconds: float) -> None:
        """Send a lease extension for ``context``'s job on the next trip."""
        self._extensions[context.job.id] = (context, seconds)

    def progress(self, context: JobContext) -> None:
        """Write ``context``'s latest progress on the next trip (before any outcome of its job
        in that trip, which then carries it into archived_jobs or dead_letter)."""
        self._progress[context.job.id] = context

    async def trip(
        self, conn: psycopg.AsyncConnection[Any], limit: int, *, ahead: int = 0
    ) -> Claimed:
        """Send everything pending and claim up to ``limit`` jobs (for free slots) and
        ``ahead`` more (to start as slots free up), in one round trip; returns the jobs claimed
        and what the claim said of the limits. A claim under limits takes no job ahead: a job
        waiting for a slot would hold a place under its limit that another worker could use.
        On a lost connection (``DatabaseUnavailable``) or a schema changed under the worker
        (``SchemaMissing``, a migration in progress) everything stays pending for the next trip
        and the error is raised."""
        settle = self.outcomes.drain() if len(self.outcomes) else None
        extensions, self._extensions = self._extensions, {}
        extend = ExtendParams.of(self.owner, extensions.values()) if extensions else None
        reports, self._progress = self._progress, {}
        progress = ProgressParams.of(self.owner, reports.values()) if reports else None
        # Under limits only for free slots: a claim of jobs ahead alone stays a plain one.
        under_limits = self._claim_under_limits(limit)
        slots = limit
        if not under_limits:
            limit += ahead
        try:
            done = await settle_and_claim(
                conn,
                settle,
                extend,
                self.claim,
                limit,
                limited=under_limits,
                slots=slots,
                progress=progress,
            )
        except (DatabaseUnavailable, SchemaMissing):
            if settle is not None:
                self.outcomes.restore(settle)
            self._extensions = {**extensions, **self._extensions}
            self._progress = {**reports, **self._progress}
            raise
        except QueryFailed as exc:
            # Not a connection problem, so the same trip would be refused again: apply the
            # outcomes apart, to find the one the database refuses. Claim on the next trip.
            # A standby, or a transaction-mode pooler pgjobs was not told about: about no row.
            about_no_row = _READ_ONLY in str(exc) or isinstance(exc, PoolerMismatch)
            if settle is None or about_no_row:
                # Kept for a later trip; the worker's loop logs it and backs off while it repeats.
                if settle is not None:
                    self.outcomes.restore(settle)
                sent = _refused_part(limit, extensions, outcomes=settle is not None)
                refused = f"{sent} refused by the database: {exc}"
                log.debug("%s", refused)
                return Claimed([], None, 0, refused=refused)
            self._extensions = {**extensions, **self._extensions}
            self._progress = {**reports, **self._progress}
            log.warning("%s; applying the %d outcome(s) of the batch apart", exc, len(settle))
            await settle_apart(conn, settle, self.claim, self.outcomes)
            return Claimed([], None, 0)
        report_stale(settle, done.settled)
        claimed, unloadable = unloadable_jobs(done.claimed)
        for job, problem in unloadable:
            self.invalid_payload(job, problem)
        for job_id, (context, _) in extensions.items():
            if job_id not in done.extended:
                context.lease_lost = True
                log.warning("job %d: lease extension refused, the lease was already lost", job_id)
        if limit > 0:  # every claim says whether some queues are limited (JOB_CLAIM: if so)
            self._learn(done.status, under_limits, short=len(done.claimed) < limit)
        return Claimed(claimed, done.status, limit, tuple(job for job, _ in unloadable))


#: How ``db.translate_errors`` names a write refused by a read-only database (a standby, or
#: ``default_transaction_read_only``): SQLSTATE 25006, read_only_sql_transaction.
_READ_ONLY = "(SQLSTATE 25006)"


def _refused_part(limit: int, extensions: dict[int, Any], *, outcomes: bool = False) -> str:
    """What a refused trip sent: a claim (``limit`` > 0), ``extensions``, outcomes (kept)."""
    sent = ["outcomes (kept for a later trip)"] if outcomes else []
    if limit > 0:  # not how many: the same refusal reads the same
        sent.append("claim")
    if extensions:
        ids = ",".join(map(str, extensions))
        sent.append(f"lease extension(s) of job(s) {ids} (not sent)")
    return " and ".join(sent) or "round trip"
