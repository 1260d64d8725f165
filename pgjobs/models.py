"""Rows as frozen dataclasses, and the statuses a job can have."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class JobStatus(enum.StrEnum):
    """Where a job is in its life. The first three are derived from ``queued_jobs``' columns."""

    READY = "ready"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Job:
    """A row of ``queued_jobs`` as a worker claimed it."""

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

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """What an enqueue returns: the job id, and whether this call created it.

    ``created`` is False when an idempotency key matched an existing job.
    """

    id: int
    created: bool


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
