"""pgjobs: a durable background-job queue for Python, backed by PostgreSQL alone."""

from __future__ import annotations

from pgjobs.app import App
from pgjobs.batches import Batch, BatchStatus
from pgjobs.context import JobContext, current_job
from pgjobs.errors import (
    BatchNotFound,
    ConfigurationError,
    DatabaseUnavailable,
    InvalidPayload,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    JobStateConflict,
    NonRetryableError,
    PgjobsError,
    QueryFailed,
    SchemaMissing,
    Snooze,
    UnknownTask,
    WaitTimeout,
)
from pgjobs.models import DeadGroup, DeadJob, Job, JobHistory, JobStatus, QueueStats
from pgjobs.rates import Rate
from pgjobs.retry import RetryPolicy
from pgjobs.submission import JobSpec
from pgjobs.tasks import Task
from pgjobs.worker import Worker, WorkerConfig

__all__ = [
    "App",
    "Batch",
    "BatchNotFound",
    "BatchStatus",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DeadGroup",
    "DeadJob",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobExpired",
    "JobFailed",
    "JobHistory",
    "JobNotFound",
    "JobSpec",
    "JobStateConflict",
    "JobStatus",
    "NonRetryableError",
    "PgjobsError",
    "QueryFailed",
    "QueueStats",
    "Rate",
    "RetryPolicy",
    "SchemaMissing",
    "Snooze",
    "Task",
    "UnknownTask",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "current_job",
]
