"""pgjobs: a durable background-job queue for Python, backed by PostgreSQL alone."""

from __future__ import annotations

from pgjobs.app import App
from pgjobs.batches import Batch, BatchStatus
from pgjobs.context import JobContext, current_job
from pgjobs.errors import (
    BatchNotFound,
    ConfigurationError,
    DatabaseUnavailable,
    DependencyFailed,
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
    UnknownDependency,
    UnknownTask,
    WaitTimeout,
)
from pgjobs.models import DeadGroup, DeadJob, Job, JobHistory, JobStatus, QueueStats
from pgjobs.rates import Rate
from pgjobs.retry import RetryPolicy
from pgjobs.submission import JobSpec, Ref
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
    "DependencyFailed",
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
    "Ref",
    "RetryPolicy",
    "SchemaMissing",
    "Snooze",
    "Task",
    "UnknownDependency",
    "UnknownTask",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "current_job",
]
