"""Rows as frozen dataclasses and named tuples, and the statuses a job can have."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


class ArchivedStatus(enum.StrEnum):
    """How a job that left ``queued_jobs`` for ``archived_jobs`` ended (its ``status`` column)."""

    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class JobStatus(enum.StrEnum):
    """Where a job is in its life. The first three are derived from ``queued_jobs``' columns, the
    archived ones are ``archived_jobs.status`` (an ``ArchivedStatus``), and ``dead`` is a row of
    ``dead_letter``.

    Example: ``JobStatus(ArchivedStatus.CANCELLED) is JobStatus.CANCELLED``
    """

    READY = "ready"
    SCHEDULED = "scheduled"
    #: In queued_jobs, waiting for the jobs it was enqueued ``after`` to succeed.
    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = ArchivedStatus.SUCCEEDED.value
    CANCELLED = ArchivedStatus.CANCELLED.value
    EXPIRED = ArchivedStatus.EXPIRED.value
    DEAD = "dead"


class DeadReason(enum.StrEnum):
    """Why a row is in ``dead_letter``."""

    #: Failed on its last attempt.
    EXHAUSTED = "exhausted"
    #: The handler raised ``NonRetryableError``, or an exception its task does not retry
    #: (``retry_on``, ``never_retry_on``).
    NON_RETRYABLE = "non_retryable"
    #: Its lease expired on the last attempt, or on any attempt of an at-most-once task.
    LEASE_EXPIRED = "lease_expired"
    #: No task of that name is registered with the worker's app.
    UNKNOWN_TASK = "unknown_task"
    #: The payload does not fit the handler's parameters, or a value of the job's row cannot be
    #: loaded (``Unloadable``: a row pgjobs did not write).
    INVALID_PAYLOAD = "invalid_payload"
    #: An at-most-once job still running when its worker's shutdown grace period ran out.
    INTERRUPTED = "interrupted"
    #: Its handler ran longer than the task's ``timeout`` on the last attempt (or on any attempt
    #: of an at-most-once task).
    TIMEOUT = "timeout"
    #: The handler snoozed the job more times than its task's ``max_snoozes``.
    SNOOZED_OUT = "snoozed_out"
    #: A job it was enqueued ``after`` (or one of theirs) ended without succeeding; it never ran.
    DEPENDENCY_FAILED = "dependency_failed"
    #: A durable workflow's code asked for another step (or sleep) than its recorded history
    #: holds at that place: the code changed under a running workflow.
    WORKFLOW_DIVERGED = "workflow_diverged"


class Unloadable:
    """A value of a row that Python cannot hold (a time of year 10000 or ``infinity``, written by
    SQL, a dump or another program), in place of that value in a row read from the database. It
    shows as the text PostgreSQL holds, e.g. ``str(value) == "infinity"``; ``problem`` says why
    it could not be loaded. A claimed job with one goes to dead_letter unrun.

    Not a dataclass, so that ``dataclasses.asdict`` of a row keeps it whole (JSON shows ``raw``).
    """

    __slots__ = ("column", "problem", "raw")

    def __init__(self, column: str, raw: str, problem: str) -> None:
        self.column = column
        #: The value as PostgreSQL writes it ("infinity", "10000-01-01 00:00:00+00").
        self.raw = raw
        self.problem = problem

    def __str__(self) -> str:
        return self.raw

    def __repr__(self) -> str:
        return f"Unloadable({self.column!r}, {self.raw!r}, {self.problem!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unloadable) and (self.column, self.raw) == (
            other.column,
            other.raw,
        )

    def __hash__(self) -> int:
        return hash((self.column, self.raw))

    def isoformat(self) -> str:
        """The raw text, so that code that shows a datetime in ISO 8601 shows this as it is."""
        return self.raw


class Job(NamedTuple):
    """A row of ``queued_jobs`` as a worker claimed it. Immutable; a named tuple rather than a
    frozen dataclass because a worker builds one per job, at a quarter of the cost. Its
    datetimes are timezone-aware, in UTC."""

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    last_error: str | None
    created_at: datetime
    expires_at: datetime | None
    idempotency_key: str | None
    #: The version of the payload's shape it was enqueued with; None is version 1.
    payload_version: int | None = None
    #: The enqueuing span's W3C trace context (``traceparent``, ``tracestate``), or None.
    trace_context: dict[str, str] | None = None
    #: The group it belongs to (``enqueue(..., group=...)``), or None.
    group_key: str | None = None
    #: The unique key it was enqueued with (``enqueue(..., unique_key=...)``), or None.
    unique_key: str | None = None
    #: How many times its handler snoozed it (``raise pgjobs.Snooze(seconds)``).
    snoozes: int = 0

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One line of ``pgjobs stats``. Ages are in seconds; None when there is no ready job."""

    queue: str
    ready: int
    scheduled: int
    running: int
    dead: int
    finished_last_hour: int
    failed_last_hour: int
    oldest_ready_age: float | None
    #: Jobs archived (succeeded, cancelled, expired) in the last 60 seconds.
    finished_last_minute: int = 0
    #: Jobs dead-lettered in the last 60 seconds.
    failed_last_minute: int = 0
    #: Of the jobs that ran and finished (archived or dead) in the last 60 seconds: how many
    #: needed more than one attempt, and how many there were.
    retried_last_minute: int = 0
    ran_last_minute: int = 0
    #: Whether the queue is paused (`pgjobs queue pause`): its jobs stay ready, unclaimed. When,
    #: by whom and why, when it is.
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    #: Ready jobs held back for their task's concurrency limit or rate (counted in ``ready``).
    held: int = 0
    #: The queue's own limits (`pgjobs queue limit`): see ``QueueState``.
    concurrency: int | None = None
    rate_jobs: int | None = None
    rate_seconds: float | None = None
    #: Jobs waiting for their dependencies (not counted in ``scheduled``).
    waiting: int = 0

    @property
    def throughput(self) -> float:
        """Jobs archived per second over the last minute."""
        return self.finished_last_minute / 60

    @property
    def retry_rate(self) -> float | None:
        """Share (0..1) of the jobs that ran and finished in the last minute that needed more
        than one attempt; None when none finished."""
        return self.retried_last_minute / self.ran_last_minute if self.ran_last_minute else None


@dataclass(frozen=True, slots=True)
class DeadJob:
    """A row of ``dead_letter``, with its error fingerprint (see ``pgjobs.admin``).

    ``traceback`` is None in listings (``admin.dead_jobs``); ``admin.dead_job`` carries it.
    """

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    #: Why the job is dead.
    reason: DeadReason
    #: The exception's qualified type name (None when no handler ran).
    error_type: str | None
    last_error: str | None
    traceback: str | None
    worker: str | None
    created_at: datetime
    failed_at: datetime
    expires_at: datetime | None
    idempotency_key: str | None
    redrive_count: int
    redriven_at: datetime | None
    replay_of: int | None
    #: When its last attempt started (None when it never ran).
    started_at: datetime | None
    #: The error with numbers, UUIDs, hex ids and quoted strings replaced by placeholders.
    fingerprint: str
    #: The first 8 hex digits of the fingerprint's MD5: a short handle for `--fingerprint`.
    fingerprint_id: str
    #: Its tags (``enqueue(..., tags=[...])``), empty when it has none.
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadGroup:
    """Dead jobs of one task that failed with the same error fingerprint."""

    task: str
    fingerprint: str
    fingerprint_id: str
    count: int
    first_failed_at: datetime
    last_failed_at: datetime
    queues: tuple[str, ...]
    #: The newest job of the group, for `pgjobs dead show`.
    latest_id: int


@dataclass(frozen=True, slots=True)
class JobHistory:
    """A job wherever it is, with everything its row records: `pgjobs job show`.

    ``table`` is where the job lives now; columns that its table does not have are None
    (``lease_*`` outside queued_jobs, ``result`` outside archived_jobs, ``reason``/``error_type``/
    ``traceback`` outside dead_letter). ``finished_at`` is archived_jobs' finished_at or
    dead_letter's failed_at.
    """

    id: int
    table: str
    status: JobStatus
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    created_at: datetime
    expires_at: datetime | None
    idempotency_key: str | None
    last_error: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    result: Any
    worker: str | None
    finished_at: datetime | None
    reason: DeadReason | None
    error_type: str | None
    traceback: str | None
    redrive_count: int
    redriven_at: datetime | None
    #: The job this one is a replay of (None when it is not a replay).
    replay_of: int | None
    #: When its latest attempt started (None when it never ran).
    started_at: datetime | None
    #: The group it belongs to, and the unique key it was enqueued with (None: none).
    group_key: str | None
    unique_key: str | None
    #: How many times its handler snoozed it (``pgjobs.Snooze``).
    snoozes: int
    #: Its handler's last reported progress: {"done", "total", "message", "at"}; None: none.
    progress: dict[str, Any] | None
    #: Its tags (``enqueue(..., tags=[...])``), empty when it has none.
    tags: tuple[str, ...]
    #: Ids of the jobs that replay this one, oldest first.
    replays: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """Where the reads of ``pgjobs serve --read-dsn`` go, and how far behind the primary that
    server is (``queries.REPLICA_STATUS``).

    ``lag_seconds`` is 0 when the standby streams and has replayed everything it received (or
    the read DSN leads to a primary), else the age of the last transaction it replayed: on a
    primary that writes nothing for a while, a standby that lost its stream shows the time since
    the last write, an upper bound. None: the standby has replayed no transaction yet.
    """

    #: Whether the read DSN leads to a standby (False: a primary, never behind).
    standby: bool
    #: The WAL receiver's status ("streaming"), None when none runs (or the role may not see it).
    receiver: str | None
    #: WAL received but not replayed yet, in bytes.
    pending_bytes: int
    lag_seconds: float | None
    #: Whether replay was paused (``pg_wal_replay_pause()``).
    replay_paused: bool

    @property
    def text(self) -> str:
        """One line for a page's header: ``a standby, 3.2 s behind (replay paused)``."""
        if not self.standby:
            return "a primary, not behind"
        behind = "lag unknown" if self.lag_seconds is None else f"{self.lag_seconds:.1f} s behind"
        notes = [
            note
            for flag, note in (
                (self.replay_paused, "replay paused"),
                (self.receiver not in (None, "streaming"), f"WAL receiver {self.receiver}"),
            )
            if flag
        ]
        return f"a standby, {behind}" + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker process, as it registered itself in ``pgjobs_workers``."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    #: Jobs it holds a lease on right now.
    running: int
    #: Seconds since it started, and since its last heartbeat.
    uptime: float
    last_seen_age: float


@dataclass(frozen=True, slots=True)
class OrphanedLeases:
    """Running jobs leased to workers that are not live (crashed, hung or cut off): their leases
    free them when they expire."""

    jobs: int
    owners: int
    #: Seconds until the first and the last of these leases expire (negative: already expired,
    #: waiting for the lease rescuer).
    first_expiry: float | None
    last_expiry: float | None


@dataclass(frozen=True, slots=True)
class TableHealth:
    """Vacuum state and size of one pgjobs table (summed over its partitions, if any)."""

    table: str
    live_rows: int
    dead_rows: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_count: int
    total_bytes: int
    #: 0 for a table that is not partitioned.
    partitions: int
    #: Storage parameters set on the table, e.g. ["autovacuum_vacuum_scale_factor=0.01"].
    options: list[str] | None

    @property
    def dead_ratio(self) -> float | None:
        """Dead rows per live row (``n_dead_tup / n_live_tup``); None when there is no live row."""
        return self.dead_rows / self.live_rows if self.live_rows else None


@dataclass(frozen=True, slots=True)
class ArchivePartition:
    """One partition of ``archived_jobs``, holding the rows finished in [lower, upper)."""

    name: str
    #: None: MINVALUE (a table converted by migration 0004 holds all history before ``upper``).
    lower: datetime | None
    #: None for the DEFAULT partition (rows no other partition covers).
    upper: datetime | None
    is_default: bool
    #: A DETACH ... CONCURRENTLY was interrupted; `pgjobs prune` finishes it.
    detach_pending: bool
    #: The planner's estimate (None before the first ANALYZE).
    estimated_rows: int | None
    total_bytes: int


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue and its settings (``pgjobs_queues``), as `pgjobs queue list` shows it."""

    name: str
    #: When the queue was paused; None when it is not.
    paused_at: datetime | None
    #: Who paused it: user@host from the CLI, the database role from Python, or what the caller
    #: passed.
    paused_by: str | None
    pause_reason: str | None
    #: Whether queued_jobs holds a job of this queue (ready, scheduled or running).
    has_jobs: bool
    #: `pgjobs queue limit`: the most jobs of the queue running at once across every worker
    #: (None: no limit), and at most ``rate_jobs`` starts per ``rate_seconds`` (None: no rate).
    concurrency: int | None = None
    rate_jobs: int | None = None
    rate_seconds: float | None = None
    #: `pgjobs queue limit --group-concurrency`: the most jobs of one group of the queue running
    #: at once (None: no limit).
    group_concurrency: int | None = None
    #: `pgjobs queue limit --group-rate`: at most ``group_rate_jobs`` starts of one group of the
    #: queue per ``group_rate_seconds``, in any window of that length (None: no group rate).
    group_rate_jobs: int | None = None
    group_rate_seconds: float | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def limited(self) -> bool:
        """The queue has a concurrency limit, a rate, a group concurrency or a group rate."""
        return (
            self.concurrency is not None
            or self.rate_jobs is not None
            or self.group_concurrency is not None
            or self.group_rate_jobs is not None
        )


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A periodic schedule as the database records it (``pgjobs_schedules``)."""

    name: str
    task: str
    queue: str
    #: The cron expression, or "every 90s".
    schedule: str
    timezone: str
    #: "last", "skip" or a number of missed occurrences to run.
    catch_up: str
    #: The next occurrence, not enqueued yet.
    next_run_at: datetime
    #: The scheduled instant of the last occurrence enqueued, when and as which job; None before
    #: the first.
    last_run_at: datetime | None
    last_enqueued_at: datetime | None
    last_job_id: int | None
    #: When a worker last declared the schedule.
    declared_at: datetime
    #: Whether a worker declared it within the last minute: False when no running worker's app
    #: declares it any more (its row stays, and nothing is enqueued for it).
    declared: bool
    #: When it was paused (`pgjobs schedule pause`: none of its occurrences is enqueued until it
    #: is resumed), None when it is not; who paused it, and why after ": " when a reason was given.
    paused_at: datetime | None = None
    paused_by: str | None = None

    @property
    def paused(self) -> bool:
        """Whether it is paused."""
        return self.paused_at is not None


class HoldReason(enum.StrEnum):
    """What holds a group's ready jobs back (``GroupHold``)."""

    #: The group is at its limit: its running jobs reached the queue's group_concurrency, or a
    #: task's (when the app is known).
    LIMIT = "limit"
    #: An ordered task's oldest job of the group runs: the next starts when it ends.
    RUNNING = "running"
    #: An ordered task's oldest job of the group waits for a retry (order is kept across retries).
    RETRY = "retry"
    #: An ordered task's oldest job of the group is scheduled for later.
    SCHEDULED = "scheduled"
    #: A job of an ``ordered="hold"`` task and the group is in dead_letter: redrive or purge it
    #: to release the group.
    DEAD = "dead"
    #: A group rate (the queue's, or a task's) allows no more starts of the group until the
    #: oldest starts of its window leave it (``GroupHold.until``).
    RATE = "rate"


@dataclass(frozen=True, slots=True)
class GroupHold:
    """One reason a group's ready jobs cannot start, and the jobs that hold them."""

    reason: HoldReason
    #: The ordered task whose jobs are held, or the task whose group rate holds them (None for
    #: ``LIMIT`` and a queue's group rate: every task of the group).
    task: str | None
    #: The holding jobs' ids, the oldest first, at most a few (``jobs`` counts them all); for
    #: ``RATE`` none, and ``jobs`` counts the starts in the rate's window.
    job_ids: tuple[int, ...]
    jobs: int
    #: When a waiting job becomes ready (``RETRY``, ``SCHEDULED``), when the group rate allows
    #: the next start (``RATE``); None for the others.
    until: datetime | None = None
    #: The group rate that holds it, as written ("10/m"; ``RATE`` only).
    rate: str | None = None


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """One group of a queue (``enqueue(..., group=...)``): its ready and running jobs, whether
    it is at its limit, and what holds its ready jobs back (``queries.GROUPS_LOAD``)."""

    group_key: str
    #: Ready jobs, counted up to a cap: ``ready_capped`` says there are more.
    ready: int
    ready_capped: bool
    running: int
    #: Its running jobs reached the queue's group_concurrency, or a task's (when known): its
    #: ready jobs wait for one of them to end.
    at_limit: bool
    #: What holds its ready jobs back, when some cannot start (none without ready jobs): its
    #: running jobs at its limit, an ordered task's oldest job not ready, a dead job of an
    #: ``ordered="hold"`` task (the ordered tasks known only with the app).
    held_by: tuple[GroupHold, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueGroups:
    """The groups of one queue that holds grouped jobs, as `pgjobs stats`, the dashboard's queue
    page and ``pgjobs_groups_at_limit`` show them (``pgjobs.groups.load``)."""

    queue: str
    #: `pgjobs queue limit --group-concurrency` (None: no limit on the queue).
    group_concurrency: int | None
    #: Groups with jobs waiting or running; ``groups_capped``: counted up to a cap, there are more.
    groups: int
    groups_capped: bool
    #: Groups at their limit (exact: running jobs are few).
    at_limit: int
    #: The groups with the most ready jobs, most first.
    top: tuple[GroupLoad, ...]
