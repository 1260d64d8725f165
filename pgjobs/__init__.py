"""pgjobs: a durable background-job queue for Python, backed by PostgreSQL alone.

The names below load on first use (``pgjobs.App`` imports the app, ``from pgjobs import Job`` only
the models), so a process imports only what it uses: ``pgjobs --help`` needs no driver and a
worker none of the admin code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgjobs.app import App
    from pgjobs.batches import Batch, BatchStatus
    from pgjobs.context import JobContext, current_job
    from pgjobs.errors import (
        BatchNotFound,
        ChildFailed,
        ConfigurationError,
        DatabaseUnavailable,
        DependencyFailed,
        EventTimeout,
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
        StepFailed,
        UnknownDependency,
        UnknownTask,
        WaitTimeout,
        WorkflowDiverged,
        WorkflowError,
    )
    from pgjobs.flow import DependencyResults, JobResult, ResultsPage
    from pgjobs.models import DeadGroup, DeadJob, Job, JobHistory, JobStatus, QueueStats
    from pgjobs.rates import Rate
    from pgjobs.retry import RetryPolicy
    from pgjobs.submission import JobSpec, Ref
    from pgjobs.tasks import Task
    from pgjobs.worker import Worker, WorkerConfig
    from pgjobs.workflows import StepPolicy, WorkflowContext, step_policy

#: Where each public name lives.
_EXPORTS: dict[str, str] = {
    "App": "pgjobs.app",
    "Batch": "pgjobs.batches",
    "BatchNotFound": "pgjobs.errors",
    "BatchStatus": "pgjobs.batches",
    "ChildFailed": "pgjobs.errors",
    "ConfigurationError": "pgjobs.errors",
    "DatabaseUnavailable": "pgjobs.errors",
    "DeadGroup": "pgjobs.models",
    "DeadJob": "pgjobs.models",
    "DependencyFailed": "pgjobs.errors",
    "DependencyResults": "pgjobs.flow",
    "EventTimeout": "pgjobs.errors",
    "InvalidPayload": "pgjobs.errors",
    "Job": "pgjobs.models",
    "JobCancelled": "pgjobs.errors",
    "JobContext": "pgjobs.context",
    "JobExpired": "pgjobs.errors",
    "JobFailed": "pgjobs.errors",
    "JobHistory": "pgjobs.models",
    "JobNotFound": "pgjobs.errors",
    "JobResult": "pgjobs.flow",
    "JobSpec": "pgjobs.submission",
    "JobStateConflict": "pgjobs.errors",
    "JobStatus": "pgjobs.models",
    "NonRetryableError": "pgjobs.errors",
    "PgjobsError": "pgjobs.errors",
    "QueryFailed": "pgjobs.errors",
    "QueueStats": "pgjobs.models",
    "Rate": "pgjobs.rates",
    "Ref": "pgjobs.submission",
    "ResultsPage": "pgjobs.flow",
    "RetryPolicy": "pgjobs.retry",
    "SchemaMissing": "pgjobs.errors",
    "Snooze": "pgjobs.errors",
    "StepFailed": "pgjobs.errors",
    "StepPolicy": "pgjobs.workflows",
    "Task": "pgjobs.tasks",
    "UnknownDependency": "pgjobs.errors",
    "UnknownTask": "pgjobs.errors",
    "WaitTimeout": "pgjobs.errors",
    "Worker": "pgjobs.worker",
    "WorkerConfig": "pgjobs.worker",
    "WorkflowContext": "pgjobs.workflows",
    "WorkflowDiverged": "pgjobs.errors",
    "WorkflowError": "pgjobs.errors",
    "current_job": "pgjobs.context",
    "step_policy": "pgjobs.workflows",
}

__all__ = [
    "App",
    "Batch",
    "BatchNotFound",
    "BatchStatus",
    "ChildFailed",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DeadGroup",
    "DeadJob",
    "DependencyFailed",
    "DependencyResults",
    "EventTimeout",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobExpired",
    "JobFailed",
    "JobHistory",
    "JobNotFound",
    "JobResult",
    "JobSpec",
    "JobStateConflict",
    "JobStatus",
    "NonRetryableError",
    "PgjobsError",
    "QueryFailed",
    "QueueStats",
    "Rate",
    "Ref",
    "ResultsPage",
    "RetryPolicy",
    "SchemaMissing",
    "Snooze",
    "StepFailed",
    "StepPolicy",
    "Task",
    "UnknownDependency",
    "UnknownTask",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "WorkflowContext",
    "WorkflowDiverged",
    "WorkflowError",
    "current_job",
    "step_policy",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use and keep it, so the next lookup is a plain attribute."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgjobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
