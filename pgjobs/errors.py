"""Exceptions pgjobs raises. Every message names the problem and, where there is one, the fix."""

from __future__ import annotations

from typing import Any


class PgjobsError(Exception):
    """Base class of every error pgjobs raises on purpose.

    ``field`` names the input at fault when there is one (``"priority"``, ``"run_at"``,
    ``"payload"``...), so that the HTTP API can point at it; the message says it too.

    Example: ``ConfigurationError("priority 40000 is out of range", field="priority").field``
    """

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field


class ConfigurationError(PgjobsError):
    """A setting or argument is invalid (bad DSN, negative delay, unknown option value)."""


class DatabaseUnavailable(PgjobsError):
    """The database cannot be reached, or the connection was lost."""


class QueryFailed(PgjobsError):
    """PostgreSQL refused a statement for a reason other than a lost connection."""


class SchemaMissing(PgjobsError):
    """The pgjobs tables are missing or out of date: run `pgjobs migrate`."""


class UnknownTask(PgjobsError):
    """A task name is not registered with the app."""


class InvalidPayload(PgjobsError):
    """A payload is not a JSON object, cannot be serialised, or is too large."""


class NonRetryableError(Exception):
    """Raise from a handler to send the job straight to ``dead_letter`` without retrying.

    Example::

        @app.task()
        def charge(order_id: int) -> None:
            if not order_exists(order_id):
                raise pgjobs.NonRetryableError(f"order {order_id} does not exist")
    """


#: The longest a job may snooze at once: a year, in seconds.
MAX_SNOOZE = 366 * 86_400.0


class Snooze(Exception):
    """Raise from a handler to put its job back in the queue for ``seconds`` without spending an
    attempt (the data it waits for is not there yet). A task's ``max_snoozes`` (100) bounds how
    many times a job may snooze: one more goes to ``dead_letter`` with reason ``snoozed_out``.

    Example::

        @app.task()
        def publish(report_id: int) -> None:
            if not ready(report_id):
                raise pgjobs.Snooze(30)
    """

    def __init__(self, seconds: float) -> None:
        value = snooze_seconds(seconds)
        super().__init__(f"snoozed for {value:g}s")
        self.seconds = value


def snooze_seconds(seconds: object) -> float:
    """``seconds`` as a snooze takes them, a number from 0 to ``MAX_SNOOZE`` (a year); anything
    else (NaN, infinity, an int beyond any float, not a number) raises ``ValueError`` naming it.

    Example: ``snooze_seconds(30) == 30.0``
    """
    try:
        value = float(seconds)  # type: ignore[arg-type]
    except BaseException:  # not a number, or a hostile __float__
        value = float("nan")
    if not 0 <= value <= MAX_SNOOZE:  # NaN and infinity too
        raise ValueError(f"{_SNOOZE_RANGE}, got {_shown(seconds)}")
    return value


def snoozed_for(snooze: Snooze) -> float:
    """The seconds a ``Snooze`` that a handler raised asks for, checked again where the worker
    takes them: a subclass, or code that set ``seconds`` after the ``Snooze`` was built, may
    hold anything. A bad value raises ``ValueError`` (caused by ``snooze``), which fails the
    attempt as any error does.

    Example: ``snoozed_for(Snooze(30)) == 30.0``
    """
    try:
        seconds = snooze.seconds
    except BaseException as exc:  # no seconds at all, or a hostile property
        problem = f"{_SNOOZE_RANGE}; reading its seconds raised {type(exc).__name__}"
        raise ValueError(problem) from snooze
    try:
        return snooze_seconds(seconds)
    except ValueError as exc:
        raise exc from snooze


_SNOOZE_RANGE = f"Snooze takes seconds from 0 to {MAX_SNOOZE:.0f} (a year)"


def _shown(value: object) -> str:
    """``repr(value)`` in at most 40 characters, whatever ``value`` is."""
    try:
        text = repr(value)
    except BaseException:  # a hostile __repr__, or an int too long to write
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:39] + "…"


class JobNotFound(PgjobsError):
    """No job with this id is where the operation looks for it (or anywhere)."""


class JobStateConflict(PgjobsError):
    """The job is not in a state the operation allows: cancelling a running or finished job,
    replaying a job that is still queued."""


class StaleOutcome(JobStateConflict):
    """An outcome reported for an attempt that is no longer the job's current one (or whose lease
    already ended): another attempt owns the job now, so the report changes nothing."""


class NotExternal(JobStateConflict):
    """An outcome reported for a job whose running attempt was not delivered to an external
    task's downstream (a Python handler runs it, or the reporting app declares its task as a
    Python one): only a worker may settle it, so the report changes nothing."""


class LockTimeout(QueryFailed):
    """A statement waited for a lock longer than its ``lock_timeout`` and was cancelled; nothing
    changed, and it may be tried again."""


class PoolerMismatch(QueryFailed):
    """PostgreSQL refused a statement because the connection's server session changed between
    two of its statements, as it does behind a pooler in transaction mode (PgBouncer's
    ``pool_mode = transaction``) that pgjobs was not told about: a prepared statement was
    missing, already there, or another one. Set ``PGJOBS_POOLER=transaction`` (or
    ``App(pooler="transaction")``, ``--pooler transaction``).

    The statement was refused before it ran: unlike ``DatabaseUnavailable``, it wrote nothing,
    and in a transaction the transaction rolled back.

    Example: ``except pgjobs.errors.PoolerMismatch: ...  # fix the settings, then send it again``
    """


class JobFailed(PgjobsError):
    """The job ``app.wait`` waited for is in ``dead_letter``: ``reason`` (a ``DeadReason``
    value), ``error_type`` and ``last_error`` are its dead letter's.

    Example::

        try:
            app.wait(job_id)
        except pgjobs.JobFailed as exc:
            print(exc.job_id, exc.reason, exc.last_error)
    """

    def __init__(
        self, job_id: int, reason: str, error_type: str | None, last_error: str | None
    ) -> None:
        error = " ".join((last_error or "").split())[:200]  # one line
        said = f"{error_type}: {error}" if error_type else error
        super().__init__(f"job {job_id} failed ({reason})" + (f": {said}" if said else ""))
        self.job_id = job_id
        self.reason = reason
        self.error_type = error_type
        self.last_error = last_error


class JobCancelled(PgjobsError):
    """The job ``app.wait`` waited for was archived unrun or stopped: ``status`` is
    ``"cancelled"``, or ``"expired"`` (then it is the subclass ``JobExpired``).

    Example: ``except pgjobs.JobCancelled as exc: print(exc.job_id, exc.status)``
    """

    def __init__(self, job_id: int, status: str = "cancelled") -> None:
        super().__init__(f"job {job_id} was {status}")
        self.job_id = job_id
        self.status = status


class JobExpired(JobCancelled):
    """The job ``app.wait`` waited for expired (its ``expires_at`` passed before it ran).

    Example: ``except pgjobs.JobExpired: ...  # enqueue it again with a later expires``
    """

    def __init__(self, job_id: int) -> None:
        super().__init__(job_id, "expired")


class WaitTimeout(PgjobsError):
    """``app.wait`` gave up: the job had not ended within its ``timeout``. It goes on; wait
    again to see its end.

    Example: ``except pgjobs.WaitTimeout as exc: print(exc.job_id, "still running")``
    """

    def __init__(self, job_id: int, timeout: float) -> None:
        super().__init__(f"job {job_id} has not ended within {timeout:g}s")
        self.job_id = job_id
        self.timeout = timeout


class BatchNotFound(PgjobsError):
    """No batch with this id (``app.batch_status``, ``pgjobs batch show``).

    Example: ``except pgjobs.BatchNotFound: print("no batch", batch_id)``
    """


class ScheduleNotFound(ConfigurationError):
    """No periodic schedule of this name in the database (nor declared by the app, where one
    is asked): `pgjobs schedule` lists them. The HTTP API answers 404 ``schedule_not_found``.

    Example: ``except pgjobs.errors.ScheduleNotFound: print("no schedule", name)``
    """


class QueueNotFound(ConfigurationError):
    """No queue of this name is known: none of its jobs is queued, it has no settings, and the
    app declares no task on it. The HTTP API answers 404 ``queue_not_found``."""


class ScheduleNotDeclared(PgjobsError):
    """A schedule the database knows but the app at hand does not declare, for an action that
    needs its declaration (its payload, priority, attempts): run now. The HTTP API answers 409
    ``schedule_not_declared``."""


class UnknownDependency(PgjobsError):
    """A job was enqueued ``after`` an id that is in none of the three tables."""


class DependencyFailed(PgjobsError):
    """A job was enqueued ``after`` a job that already ended without succeeding (dead,
    cancelled or expired): it could never run."""


class WorkflowError(PgjobsError, NonRetryableError):
    """A durable workflow used in a way that cannot work: a step's result that is not JSON, a
    step name used twice in one run, a sleep of a negative, NaN or absurd length, a
    ``WorkflowContext`` method called outside its running workflow. Nothing is recorded; raised
    in a workflow's run it sends the job to ``dead_letter`` (``non_retryable``).

    Example: ``except pgjobs.WorkflowError as exc: print(exc)``
    """


class WorkflowDiverged(WorkflowError):
    """A workflow's code asked for another step (or sleep) than its recorded history holds at
    that place, or returned before reaching the entries it recorded: the code changed under a
    running workflow. The job goes to ``dead_letter`` with reason ``workflow_diverged``."""


class StepFailed(PgjobsError):
    """A workflow's step failed for good: its attempts are spent (``exhausted``) or it raised an
    error its policy does not retry (``non_retryable``). ``step`` names it, ``error_type`` and
    ``error`` are its last error's (the exception itself is the ``__cause__`` in the run that
    raised it). Uncaught, it sends the workflow's job to ``dead_letter`` with the step's error;
    ``pgjobs dead redrive`` runs the workflow again from that step. A workflow may catch it to
    compensate (the failure stays recorded: a later run raises it again at the same place).

    Example::

        try:
            ctx.step("charge", charge, order_id)
        except pgjobs.StepFailed as exc:
            ctx.step("release", release_stock, order_id)
            raise
    """

    def __init__(
        self, step: str, attempts: int, error_type: str, error: str, *, exhausted: bool
    ) -> None:
        tried = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        super().__init__(f"step {step!r} failed after {tried}: {error}")
        self.step = step
        self.attempts = attempts
        self.error_type = error_type
        self.error = error
        #: True: its attempts are spent; False: it raised an error it does not retry.
        self.exhausted = exhausted


class WorkflowSuspended(BaseException):
    """Raised by a workflow's ``sleep`` (and a step's retry that waits long) to give the worker
    slot back: the job returns to ``queued_jobs`` for ``seconds`` with its attempt refunded,
    and does not count as a snooze. A ``BaseException``, so that a workflow's ``except
    Exception`` does not swallow it."""

    def __init__(self, seconds: float, *, settled: bool = False) -> None:
        value = snooze_seconds(min(max(0.0, seconds), MAX_SNOOZE))
        super().__init__(f"suspended for {value:g}s")
        self.seconds = value
        #: The run already gave the job back in its own transaction (a wait for an event or for
        #: children, registered under the job's row lock): the worker has nothing to send.
        self.settled = settled


class EventTimeout(PgjobsError, NonRetryableError):
    """A workflow's ``ctx.wait_for(name, timeout=...)`` gave up: no event ``name`` came within
    ``timeout`` seconds. Recorded in the history (a later run raises it again at the same place);
    uncaught, it sends the workflow to ``dead_letter`` (``non_retryable``).

    Example: ``except pgjobs.EventTimeout as exc: print(exc.name, "never came")``
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class ChildFailed(PgjobsError, NonRetryableError):
    """Children a workflow ran (``ctx.run``, ``ctx.map``) did not all succeed: ``failures``
    lists (position, job id, status, error) of each that died, was cancelled or expired, and
    ``results`` every child's result in order (None for those). The first failure's words are
    the message. Catchable; uncaught, it sends the workflow to ``dead_letter``.

    Example::

        try:
            totals = ctx.map("reports.render", pages)
        except pgjobs.ChildFailed as exc:
            totals = [r for r in exc.results if r is not None]
    """

    def __init__(
        self, message: str, failures: list[tuple[int, int, str, str | None]], results: list[Any]
    ) -> None:
        super().__init__(message)
        self.failures = failures
        self.results = results
