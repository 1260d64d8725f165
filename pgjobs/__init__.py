"""pgjobs: a durable background-job queue for Python, backed by PostgreSQL alone."""

from __future__ import annotations

from pgjobs.app import App
from pgjobs.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidPayload,
    NonRetryableError,
    PgjobsError,
    QueryFailed,
    SchemaMissing,
    UnknownTask,
)
from pgjobs.models import EnqueuedJob, Job, JobStatus, QueueStats
from pgjobs.tasks import JobSpec, RetryPolicy, Task
from pgjobs.worker import JobContext, Worker, WorkerConfig, current_job

__all__ = [
    "App",
    "ConfigurationError",
    "DatabaseUnavailable",
    "EnqueuedJob",
    "InvalidPayload",
    "Job",
    "JobContext",
    "JobSpec",
    "JobStatus",
    "NonRetryableError",
    "PgjobsError",
    "QueryFailed",
    "QueueStats",
    "RetryPolicy",
    "SchemaMissing",
    "Task",
    "UnknownTask",
    "Worker",
    "WorkerConfig",
    "current_job",
]
