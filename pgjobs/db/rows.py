"""Rows as ``models``: one function per select list of ``queries``, named after the model it
returns."""

from __future__ import annotations

import dataclasses
from typing import Any

from pgjobs.models import (
    ArchivePartition,
    DeadGroup,
    DeadJob,
    DeadReason,
    Job,
    JobHistory,
    JobStatus,
    OrphanedLeases,
    QueueState,
    QueueStats,
    ScheduleInfo,
    TableHealth,
    WorkerInfo,
)


def job_from_row(row: tuple[Any, ...]) -> Job:
    """A claimed ``queued_jobs`` row (columns as ``queries.JOB_COLUMNS``) as a ``Job``."""
    return Job(*row)


def dead_job_from_row(row: tuple[Any, ...]) -> DeadJob:
    """A ``dead_letter`` row (columns as ``queries.DEAD_LIST``) as a ``DeadJob``."""
    job = DeadJob(*row)
    return dataclasses.replace(job, reason=DeadReason(job.reason))


def dead_group_from_row(row: tuple[Any, ...]) -> DeadGroup:
    """A row of ``queries.DEAD_GROUP`` as a ``DeadGroup``."""
    task, fingerprint, fingerprint_id, count, first, last, queues, latest_id = row
    return DeadGroup(
        task, fingerprint, fingerprint_id, count, first, last, tuple(queues), latest_id
    )


def job_history_from_row(row: tuple[Any, ...]) -> JobHistory:
    """A row of ``queries.JOB_LOOKUP`` as a ``JobHistory``."""
    job = JobHistory(*row)
    return dataclasses.replace(
        job,
        status=JobStatus(job.status),
        reason=None if job.reason is None else DeadReason(job.reason),
        replays=tuple(job.replays),
    )


def archive_partition_from_row(row: tuple[Any, ...]) -> ArchivePartition:
    """A row of ``queries.ARCHIVE_PARTITIONS`` as an ``ArchivePartition``."""
    return ArchivePartition(*row)


def queue_stats_from_row(row: tuple[Any, ...]) -> QueueStats:
    """A row of ``queries.QUEUE_STATS`` as a ``QueueStats``."""
    return QueueStats(*row)


def queue_state_from_row(row: tuple[Any, ...]) -> QueueState:
    """A row of ``queries.QUEUE_LIST`` or ``queries.QUEUE_GET`` as a ``QueueState``."""
    return QueueState(*row)


def schedule_info_from_row(row: tuple[Any, ...]) -> ScheduleInfo:
    """A row of ``queries.SCHEDULE_LIST`` as a ``ScheduleInfo``."""
    return ScheduleInfo(*row)


def worker_info_from_row(row: tuple[Any, ...]) -> WorkerInfo:
    """A row of ``queries.WORKERS_LIVE`` as a ``WorkerInfo``."""
    return WorkerInfo(*row)


def orphaned_leases_from_row(row: tuple[Any, ...]) -> OrphanedLeases:
    """The row of ``queries.LEASES_WITHOUT_LIVE_WORKER`` as an ``OrphanedLeases``."""
    return OrphanedLeases(*row)


def table_health_from_row(row: tuple[Any, ...]) -> TableHealth:
    """A row of ``queries.TABLE_HEALTH`` as a ``TableHealth``."""
    return TableHealth(*row)
